"""A text corpus the project writes itself, so the built-in models need no download.

Three categories mirror the bench's prompt categories (math, code, chat). Everything is
drawn from a seeded `random.Random`, so the same seed always gives the same text.

Every prompt belongs to one split, by a hash of its text: about a quarter are `eval` prompts,
the rest `train`. The built-in target learns from both (it stands for a pretrained LLM), but a
draft trains only on `train` prompts while validate and bench measure only `eval` ones, so no
measured acceptance comes from a prompt the draft has seen.
"""

import hashlib
import random

NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jon"]
ITEMS = ["apples", "books", "coins", "pencils", "stamps", "marbles", "cookies", "shells"]
VERBS = ["buys", "finds", "gets", "wins", "makes"]
FUNCS = [
    ("add", "{a} + {b}"), ("sub", "{a} - {b}"), ("mul", "{a} * {b}"), ("biggest", "max({a}, {b})"),
    ("smallest", "min({a}, {b})"), ("mean", "({a} + {b}) / 2"), ("power", "{a} ** {b}"),
    ("remainder", "{a} % {b}"), ("halve_sum", "({a} + {b}) // 2"), ("distance", "abs({a} - {b})"),
]
ARGS = [("a", "b"), ("x", "y"), ("m", "n"), ("left", "right")]
TOPICS = ["the weather", "a good book", "cooking rice", "learning to swim", "the night sky",
          "a trip to the sea", "planting tomatoes", "fixing a bike", "baking bread", "running a mile",
          "keeping a diary", "painting a room", "learning chess", "saving money", "walking a dog",
          "making tea", "moving house", "a job interview", "learning to draw", "camping in the rain",
          "growing herbs", "writing a letter", "a long flight", "sleeping well", "learning a song",
          "cleaning the kitchen", "a first day at school", "feeding a cat", "riding a horse",
          "building a shelf", "reading maps", "a rainy weekend"]
ASKS = ["Can you give me a tip about {}?", "Any advice on {}?", "What should I know about {}?",
        "I need help with {}. Any ideas?", "How do I get better at {}?"]
ADVICE = ["Start small and practise a little every day.", "Ask a friend who has done it before.",
          "Write down what worked and what did not.", "Take a short break, then try again.",
          "Keep it simple and be patient."]
SPLITS = ("train", "eval")


def split_of(prompt: str) -> str:
    """`eval` for about a quarter of all prompts, `train` for the rest; fixed by the text alone."""
    return "eval" if hashlib.sha256(prompt.encode()).digest()[0] < 64 else "train"


def math_sample(rng: random.Random) -> tuple[str, str]:
    name, item, verb = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(VERBS)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    prompt = f"{name} has {a} {item} and {verb} {b} more. How many {item} does {name} have now?"
    answer = f"{name} starts with {a} {item}. {a} + {b} = {a + b}. The answer is {a + b}."
    return prompt, answer


def code_sample(rng: random.Random) -> tuple[str, str]:
    (name, body), (x, y) = rng.choice(FUNCS), rng.choice(ARGS)
    body = body.format(a=x, b=y)
    prompt = f"Write a Python function {name}({x}, {y}) that returns {body}."
    answer = f"def {name}({x}, {y}):\n    return {body}\n\nprint({name}({rng.randint(1, 9)}, {rng.randint(1, 9)}))"
    return prompt, answer


def chat_sample(rng: random.Random) -> tuple[str, str]:
    topic = rng.choice(TOPICS)
    prompt = rng.choice(ASKS).format(topic)
    answer = f"Sure! About {topic}: {rng.choice(ADVICE)} {rng.choice(ADVICE)}"
    return prompt, answer


CATEGORIES = {"math": math_sample, "code": code_sample, "chat": chat_sample}


def samples(n: int, seed: int = 0, split: str | None = None) -> list[tuple[str, str, str]]:
    """`n` (category, prompt, answer) triples, cycling through the categories; only prompts of
    `split` when it is given (draws from the other split are skipped)."""
    if split not in (None, *SPLITS):
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    rng = random.Random(seed)
    names = list(CATEGORIES)
    out = []
    while len(out) < n:
        category = names[len(out) % 3]
        prompt, answer = CATEGORIES[category](rng)
        if split is None or split_of(prompt) == split:
            out.append((category, prompt, answer))
    return out
