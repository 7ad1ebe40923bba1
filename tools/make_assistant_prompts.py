"""Write `dflash_et/data/assistant_prompts.jsonl`: prompts like those a real chat assistant gets.

Why: the built-in corpus (dflash_et/data/corpus.py) is made for the tiny built-in targets and is
three templates with numbers swapped. A real pretrained chat model (SmolLM2-135M-Instruct, Qwen3)
answers far more varied requests, and a draft trained or measured on toy prompts says little about
its acceptance on real use. So this set holds six kinds of everyday request, in varied phrasing,
each answerable in under ~100 tokens by a small instruct model: `math` (arithmetic word problems),
`code` (write, explain or fix a small Python function), `chat` (open questions and advice),
`summarize` (a 60-120 word paragraph given in the prompt), `rewrite` (a sentence or short text to
make formal, simpler, shorter, correct, politer or livelier) and `multi-turn` (a user turn, a short
assistant reply, and a follow-up for the model to answer).

The content and the phrasings are data, in `dflash_et/data/assistant_pools.json` (POOLS); this file
only deals them into rows. Disjoint by construction: every piece of content (names, story problems,
function tasks, code snippets, topics, questions, paragraphs, sentences, conversations) lives in a
`{"train": [...], "eval": [...]}` pool, and a row of a split is built only from its split's pool, so a
draft trained on `train` never saw the content of an `eval` prompt. Only the instruction phrasings
("Summarize this paragraph in one sentence:", "Show your working.") and the generic multi-turn
follow-ups are shared, as they would be between any two users; `SHARED_PHRASINGS` lists them.
`check_disjoint` refuses a pool whose splits share an item, and tests/test_assistant_prompts.py
checks the output: once that shared phrasing is taken out, no eval prompt shares an 8-word run with
a train prompt.

Deterministic: each (category, split) draws from its own seeded `random.Random`, so editing one
pool reshuffles only that pool's rows; no network, no models. Run from the repository root:

    python tools/make_assistant_prompts.py [--out PATH]
"""

import argparse
import json
import random
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

DATA = Path(__file__).resolve().parent.parent / "dflash_et" / "data"
POOLS, OUT = DATA / "assistant_pools.json", DATA / "assistant_prompts.jsonl"
SEED = 2024
SPLITS = ("train", "eval")
# Rows per piece of content: train reuses a piece under several phrasings, to reach ~880 rows;
# eval uses each piece once, so that its ~96 rows are as varied as possible.
TRAIN_REUSE = {"math": 2, "code-write": 2, "summarize": 3, "multi-turn": 3}


def split_pool(pool: dict) -> dict:
    """A {"train": [...], "eval": [...]} pool with its JSON lists of slots (a comparison's pair, a
    function task's signature and task, a conversation's three turns) as tuples: hashable, and told
    apart from a single item when a phrasing is filled."""
    return {split: [tuple(item) if isinstance(item, list) else item for item in items] for split, items in pool.items()}


def layouts(instructions: list[str]) -> list[str]:
    """A rewrite instruction laid out twice: before the text in quotes, and above it."""
    return [f'{ask} "{{}}"' for ask in instructions] + [f"{ask}\n\n{{}}" for ask in instructions]


_pools = json.loads(POOLS.read_text(encoding="utf-8"))
_math, _code, _summarize, _multi = _pools["math"], _pools["code"], _pools["summarize"], _pools["multi-turn"]
# math: story problems. {name} and {other} are two different people; numbers come from `numbers`:
# {a} 20-90, {b} 2-19 (so a - b > 0), {c} 2-9, {m} a multiple of {c}, {p} a price of 2-15.
NAMES, MATH, MATH_ASKS = split_pool(_pools["names"]), split_pool(_math["problems"]), _math["asks"]
# code: functions to write (signature, what it does), snippets to explain, buggy snippets to fix (goal, code)
WRITE_TASKS, WRITE_ASKS = split_pool(_code["write_tasks"]), _code["write_asks"]
EXPLAIN_SNIPPETS, EXPLAIN_ASKS = split_pool(_code["explain_snippets"]), _code["explain_asks"]
FIX_SNIPPETS, FIX_ASKS = split_pool(_code["fix_snippets"]), _code["fix_asks"]
# chat: each kind is (phrasings, pool); a phrasing's {} slots take the item (a pair for comparisons)
CHAT = [(kind["phrasings"], split_pool(kind["pool"])) for kind in _pools["chat"]]
# summarize: paragraphs of 60-120 words, each given whole in the prompt
PARAGRAPHS, SUMMARIZE_ASKS = split_pool(_summarize["paragraphs"]), _summarize["asks"]
# rewrite: each kind is (phrasings, pool of texts to rewrite)
REWRITE = [(layouts(kind["instructions"]), split_pool(kind["pool"])) for kind in _pools["rewrite"]]
# multi-turn: (user, short assistant reply, a follow-up about that reply); train rows also ask the
# generic follow-ups, which fit any reply
CONVERSATIONS, FOLLOW_UPS = split_pool(_multi["conversations"]), _multi["follow_ups"]


def reuse(kind: str, split: str) -> int:
    return TRAIN_REUSE[kind] if split == "train" else 1


def deal(rng: random.Random, options: list) -> Iterator:
    """Endless draws from `options` in freshly shuffled rounds, so every phrasing is used about equally."""
    while True:
        yield from rng.sample(options, len(options))


def numbers(rng: random.Random) -> dict[str, int]:
    c = rng.randint(2, 9)
    return dict(a=rng.randint(20, 90), b=rng.randint(2, 19), c=c, m=c * rng.randint(3, 12), p=rng.randint(2, 15))


def math_rows(split: str, rng: random.Random) -> list[dict]:
    asks = deal(rng, MATH_ASKS)
    rows = []
    for problem in MATH[split]:
        for _ in range(reuse("math", split)):
            name, other = rng.sample(NAMES[split], 2)
            rows.append({"prompt": next(asks).format(problem.format(name=name, other=other, **numbers(rng)))})
    return rows


def code_rows(split: str, rng: random.Random) -> list[dict]:
    rows = []
    for sig, task in WRITE_TASKS[split]:
        for ask in rng.sample(WRITE_ASKS, reuse("code-write", split)):
            rows.append({"prompt": ask.format(sig=sig, name=sig.split("(")[0], task=task)})
    explain, fix = deal(rng, EXPLAIN_ASKS), deal(rng, FIX_ASKS)
    rows += [{"prompt": next(explain).format(code)} for code in EXPLAIN_SNIPPETS[split]]
    rows += [{"prompt": next(fix).format(goal=goal, code=code)} for goal, code in FIX_SNIPPETS[split]]
    return rows


def phrased_rows(kinds: list[tuple[list[str], dict]], split: str, rng: random.Random) -> list[dict]:
    """One row per item of each kind's pool, in one of the kind's phrasings (a pair fills two slots)."""
    rows = []
    for phrasings, pool in kinds:
        asks = deal(rng, phrasings)
        rows += [{"prompt": next(asks).format(*(item if isinstance(item, tuple) else (item,)))} for item in pool[split]]
    return rows


def summarize_rows(split: str, rng: random.Random) -> list[dict]:
    return [{"prompt": ask.format(paragraph)} for paragraph in PARAGRAPHS[split]
            for ask in rng.sample(SUMMARIZE_ASKS, reuse("summarize", split))]


def multi_turn_rows(split: str, rng: random.Random) -> list[dict]:
    rows = []
    for user, reply, follow_up in CONVERSATIONS[split]:
        for last in [follow_up, *rng.sample(FOLLOW_UPS, reuse("multi-turn", split) - 1)]:
            rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply},
                                      {"role": "user", "content": last}]})
    return rows


CATEGORIES: dict[str, Callable[[str, random.Random], list[dict]]] = {
    "math": math_rows, "code": code_rows, "chat": partial(phrased_rows, CHAT), "summarize": summarize_rows,
    "rewrite": partial(phrased_rows, REWRITE), "multi-turn": multi_turn_rows,
}
# The wording both splits share: every phrasing a row is built with ({...} marks where content goes)
# and the generic follow-ups. All else in a prompt comes from its split's pools.
SHARED_PHRASINGS = [*MATH_ASKS, *WRITE_ASKS, *EXPLAIN_ASKS, *FIX_ASKS, *SUMMARIZE_ASKS, *FOLLOW_UPS,
                    *(phrasing for kinds in (CHAT, REWRITE) for phrasings, _ in kinds for phrasing in phrasings)]
SPLIT_POOLS = [NAMES, MATH, WRITE_TASKS, EXPLAIN_SNIPPETS, FIX_SNIPPETS, PARAGRAPHS, CONVERSATIONS,
               *(pool for _, pool in CHAT), *(pool for _, pool in REWRITE)]


def check_disjoint() -> None:
    """Refuse a pool whose train and eval lists share an item, and a paragraph outside 60-120 words."""
    for pool in SPLIT_POOLS:
        if shared := set(pool["train"]) & set(pool["eval"]):
            raise ValueError(f"in both splits: {sorted(shared)[:3]}")
    for paragraph in PARAGRAPHS["train"] + PARAGRAPHS["eval"]:
        if not 60 <= len(paragraph.split()) <= 120:
            raise ValueError(f"paragraph of {len(paragraph.split())} words: {paragraph[:60]!r}")


def rows(split: str) -> list[dict]:
    """All rows of `split`, the categories interleaved (math, code, chat, ...) so that the first n
    rows of a split cover every category; within a category, shuffled."""
    per_category = []
    for category, build in CATEGORIES.items():
        rng = random.Random(f"{SEED}-{category}-{split}")
        built = build(split, rng)
        rng.shuffle(built)
        per_category.append([{"category": category, "split": split, **row} for row in built])
    longest = max(map(len, per_category))
    return [group[i] for i in range(longest) for group in per_category if i < len(group)]


def generate() -> str:
    """The JSONL text: train rows, then eval rows; refuses duplicate prompts."""
    check_disjoint()
    all_rows = [row for split in SPLITS for row in rows(split)]
    texts = [json.dumps(row.get("prompt") or row["messages"], ensure_ascii=False) for row in all_rows]
    if len(set(texts)) != len(texts):
        raise ValueError("duplicate prompts")
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in all_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    out = parser.parse_args().out
    out.write_text(generate(), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
