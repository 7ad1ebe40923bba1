"""A text corpus the project writes itself, so the built-in models need no download.

Three categories mirror the bench's prompt categories (math, code, chat). Everything is
drawn from a seeded `random.Random`, so the same seed always gives the same text.
"""

import random

NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jon"]
ITEMS = ["apples", "books", "coins", "pencils", "stamps", "marbles", "cookies", "shells"]
VERBS = ["buys", "finds", "gets", "wins", "makes"]
FUNCS = [
    ("add", "a + b"), ("sub", "a - b"), ("mul", "a * b"), ("biggest", "max(a, b)"),
    ("smallest", "min(a, b)"), ("mean", "(a + b) / 2"),
]
TOPICS = ["the weather", "a good book", "cooking rice", "learning to swim", "the night sky",
          "a trip to the sea", "planting tomatoes", "fixing a bike"]
ADVICE = ["Start small and practise a little every day.", "Ask a friend who has done it before.",
          "Write down what worked and what did not.", "Take a short break, then try again.",
          "Keep it simple and be patient."]


def math_sample(rng: random.Random) -> tuple[str, str]:
    name, item, verb = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(VERBS)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    prompt = f"{name} has {a} {item} and {verb} {b} more. How many {item} does {name} have now?"
    answer = f"{name} starts with {a} {item}. {a} + {b} = {a + b}. The answer is {a + b}."
    return prompt, answer


def code_sample(rng: random.Random) -> tuple[str, str]:
    name, body = rng.choice(FUNCS)
    prompt = f"Write a Python function {name}(a, b) that returns {body}."
    answer = f"def {name}(a, b):\n    return {body}\n\nprint({name}({rng.randint(1, 9)}, {rng.randint(1, 9)}))"
    return prompt, answer


def chat_sample(rng: random.Random) -> tuple[str, str]:
    topic = rng.choice(TOPICS)
    prompt = f"Can you give me a tip about {topic}?"
    answer = f"Sure! About {topic}: {rng.choice(ADVICE)} {rng.choice(ADVICE)}"
    return prompt, answer


CATEGORIES = {"math": math_sample, "code": code_sample, "chat": chat_sample}


def samples(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """`n` (category, prompt, answer) triples, cycling through the categories."""
    rng = random.Random(seed)
    names = list(CATEGORIES)
    return [(names[i % 3], *CATEGORIES[names[i % 3]](rng)) for i in range(n)]
