"""Tool-calling chats the built-in target learns, so `dflash serve` answers an OpenAI `tools` request with a call.

A real chat model is trained to call the functions a request declares; the built-in target stands for one, so it
learns the same on chats the project writes itself: a user asks something one of the declared tools answers (among
up to two others), and the reply is that call, in the format the target's own chat template writes calls in (Qwen3's
Hermes `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, Gemma 4's `<|tool_call>call:NAME{..}<tool_call|>`:
what ExecuTorch's server parses for the family); half the chats go on, the tool's result comes back and the reply
reads it out. Tools are OpenAI function declarations, keys in the order clients write them.
These chats are not a bench category: the draft never trains on them and the bench never measures them.
"""

import json
import random

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Rome", "Delhi", "Quito", "Seoul", "Dakar", "Perth", "Boston"]
DISHES = ["rice", "bread", "soup", "pancakes", "curry", "a salad", "pasta", "dumplings"]
WORDS = ["harbor", "quiet", "lantern", "gravel", "orbit", "meadow", "signal", "velvet"]
SUBJECTS = ["birds", "rivers", "chess", "volcanoes", "gardens", "trains", "the moon", "bees"]

# name, description, parameter, its values, how users ask, what the tool returns, how the reply reads it out
TOOLS = [
    ("get_weather", "Get the current weather for a city.", "city", CITIES,
     ["What is the weather in {}?", "Is it raining in {}?", "How warm is it in {}?"],
     ["sunny, 21 C", "light rain, 12 C", "cloudy, 8 C", "clear, 30 C"], "The weather in {value} is {result}."),
    ("get_time", "Get the local time in a city.", "city", CITIES,
     ["What time is it in {}?", "Tell me the local time in {}."],
     ["09:15", "13:40", "18:05", "23:30"], "It is {result} in {value}."),
    ("get_population", "Get how many people live in a city.", "city", CITIES,
     ["How many people live in {}?", "What is the population of {}?"],
     ["about 2 million", "about 700 thousand", "about 11 million"], "{value} has {result} people."),
    ("find_recipe", "Find a recipe for a dish.", "dish", DISHES,
     ["How do I make {}?", "Find me a recipe for {}."],
     ["boil, stir, then rest for five minutes", "mix, knead and bake for half an hour"],
     "To make {value}: {result}."),
    ("define_word", "Look up what a word means.", "word", WORDS,
     ["What does {} mean?", "Define the word {}."],
     ["a place or a thing that keeps something safe", "a small sound or a sign"], "{value} means {result}."),
    ("search_books", "Search the library for books about a subject.", "subject", SUBJECTS,
     ["Find books about {}.", "Are there any books on {}?"],
     ["3 books found", "12 books found", "no books found"], "For {value}: {result}."),
]
NUDGES = ["", " Use the tool.", " Please use a tool.", " Call the function."]


def declaration(name: str, description: str, parameter: str) -> dict:
    """A tool as an OpenAI request declares it."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {parameter: {"type": "string"}}, "required": [parameter]}}}


def tool_call(name: str, arguments: dict) -> str:
    """A call as Qwen3's Hermes format writes it: the built-in tokenizer's corpus text (`as_text`)."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments) + "}\n</tool_call>"


def as_text(reply: dict) -> str:
    """A reply of `tool_chat` as text in the Hermes format, what the built-in tokenizer trains its merges on (a
    model learns the reply as its own template renders it: data.chat.reply_text)."""
    calls = [c["function"] for c in reply.get("tool_calls") or []]
    return reply["content"] or "\n".join(tool_call(c["name"], c["arguments"]) for c in calls)


def tool_chat(rng: random.Random) -> tuple[list[dict], list[dict], dict]:
    """(messages, tools, reply): a user question one declared tool answers and the assistant's call to it, or (half
    the time) the same chat carried on to the tool's result and the answer read from it."""
    name, description, parameter, values, asks, results, says = rng.choice(TOOLS)
    others = rng.sample([t for t in TOOLS if t[0] != name], rng.randint(0, 2))
    tools = [declaration(*t[:3]) for t in [*others, (name, description, parameter)]]
    rng.shuffle(tools)
    value = rng.choice(values)
    messages = [{"role": "user", "content": rng.choice(asks).format(value) + rng.choice(NUDGES)}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": {parameter: value}}}]}
    if rng.random() < 0.5:
        return messages, tools, call
    result = rng.choice(results)
    messages += [call, {"role": "tool", "content": result}]
    return messages, tools, {"role": "assistant", "content": says.format(value=value, result=result)}
