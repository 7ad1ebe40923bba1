"""Prompt sets for validation, benchmarking and training: the project's own, a JSONL file or a hub dataset (rendered
with the target's chat template by data.chat)."""

import json
from collections.abc import Callable
from pathlib import Path

from dflash_et.data.corpus import SPLITS, samples

PROMPT_SEED = 1234  # not the corpus seed the built-in models are made from


def builtin_prompts(n: int, seed: int = PROMPT_SEED, split: str = "eval") -> list[dict]:
    """`n` prompts written for this project, cycling through the math, code and chat categories.
    Measurements use `eval` prompts, which no draft trains on (see corpus.split_of)."""
    return [{"category": c, "prompt": p} for c, p, _ in samples(n, seed=seed, split=split)]


# Prompt sets packaged with the project: `builtin` (the corpus the built-in targets learn from) and
# `assistant` (what a real chat assistant gets, for real pretrained targets; written by
# tools/make_assistant_prompts.py, its eval split disjoint from its train split by construction).
PROMPT_SETS = ("builtin", "assistant")
ASSISTANT_PROMPTS = Path(__file__).parent / "assistant_prompts.jsonl"

# Benchmark sets on the Hugging Face hub, by short name: (dataset, config, split).
DATASETS = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "humaneval": ("openai/openai_humaneval", None, "test"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
}


def load_prompts(source: str, n: int, split: str = "eval") -> list[dict]:
    """The first `n` prompts of `source`'s `split`: a packaged set (see PROMPT_SETS), a JSONL file, a hub
    benchmark by name (gsm8k, humaneval, mt-bench) or any dataset as `hf:<repo or dir>[:config][@split]`.

    `split` (train or eval) keeps drafts from training on what is measured: a packaged set has both, and a
    file's rows with a `split` field count only for that split (rows without one count for both). Hub
    benchmarks are only ever measured, so they are used whole.

    A row's prompt is its `messages` (a conversation that ends on the user turn to answer, kept as the
    list), else its `prompt`, `question` or first of `turns`; its category is its `category` field,
    else the source's name.
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    if source == "builtin":
        return builtin_prompts(n, split=split)
    if source in DATASETS or source.startswith("hf:"):
        return _dataset_prompts(source, n)
    path = ASSISTANT_PROMPTS if source == "assistant" else Path(source)
    if not path.is_file():
        raise ValueError(f"prompts {source!r}: not 'builtin', a JSONL file, 'hf:<dataset>' or one of "
                         f"{sorted({*PROMPT_SETS, *DATASETS})}")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    picked = [(i, row) for i, row in enumerate(rows) if row.get("split", split) == split][:n]
    return [_prompt_row(row, "file", f"{path}:{i + 1}") for i, row in picked]


def _dataset_prompts(source: str, n: int) -> list[dict]:
    from datasets import load_dataset

    if source in DATASETS:
        name, (repo, config, split) = source, DATASETS[source]
    else:
        spec, _, split = source.removeprefix("hf:").partition("@")
        repo, _, config = spec.partition(":")
        name, config, split = Path(repo).name, config or None, split or "train"
    try:
        dataset = load_dataset(repo, config, split=split)
    except Exception as e:  # noqa: BLE001  hub or file boundary: offline, not found, bad split
        raise ValueError(f"prompts {source!r}: cannot load dataset {repo!r} ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); "
                         "use a local JSONL file or 'builtin'") from None
    return [_prompt_row(row, name, f"{source} row {i}") for i, row in enumerate(dataset.select(range(min(n, len(dataset)))))]


def _prompt_row(row: dict, category: str, where: str) -> dict:
    if "messages" in row:
        messages = row["messages"]
        turns = isinstance(messages, list) and all(
            isinstance(m, dict) and m.get("role") and isinstance(m.get("content"), str) for m in messages)
        if not (turns and messages and messages[-1]["role"] == "user"):
            raise ValueError(f"{where}: 'messages' must be a list of {{'role', 'content'}} turns ending on a user turn")
        return {"category": row.get("category") or category, "prompt": messages}
    text = row.get("prompt") or row.get("question") or row.get("turns")
    if isinstance(text, list):
        text = text[0] if text else None
    if not text:
        raise ValueError(f"{where}: no 'prompt', 'question' or 'turns' field, nor 'messages'")
    return {"category": row.get("category") or category, "prompt": text}


LONG = "long"  # the category of long prompts: a document, then a question


def document_texts(source: str, tokens: int) -> list[str]:
    """Enough of `source`'s train-split texts for documents of up to `tokens` tokens (a text is some 8 or more),
    so that no long prompt holds a measured question (builtin: its prompts with their answers)."""
    n = tokens // 8 + 1
    if source == "builtin":
        return [f"{prompt}\n{answer}" for _, prompt, answer in samples(n, seed=PROMPT_SEED, split="train")]
    return [text_of(r["prompt"]) for r in load_prompts(source, n, split="train")]


def text_of(prompt: str | list[dict]) -> str:
    """A prompt as plain text to put in a document: a conversation's turns, one after another."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def _asked(question: str | list[dict], chosen: list[str]) -> str | list[dict]:
    """`question` after a document of the `chosen` texts; a conversation gets it in its last user turn."""
    document = "\n\n".join(chosen)

    def ask(q: str) -> str:
        return f"Read these notes, then answer the question after them.\n\n{document}\n\nQuestion: {q}"

    if isinstance(question, str):
        return ask(question)
    return [*question[:-1], {**question[-1], "content": ask(question[-1]["content"])}]


def with_documents(questions: list[str | list[dict]], texts: list[str], lengths: list[int],
                   count: Callable[[str | list[dict]], int], rotate: bool = False) -> list[str | list[dict]]:
    """Each question after a document of `texts` within its length in tokens, as `count` (a prompt's length in
    tokens) counts it: texts taken in order (and again from the first if they run out), one that would not fit
    skipped. What each text adds is counted once for all the prompts (a 4k-token document is hundreds of texts,
    and counting is a chat template and a tokenizer); it is nearly exact (tokens merge at the seams), so each
    prompt is counted whole at the end and trimmed. `rotate`: documents start at texts spread over `texts`, so
    that they differ."""
    if not texts:
        raise ValueError("no texts to make a document of: the prompt set has no train-split rows")
    if not questions:
        return []
    base = count(_asked(questions[0], []))
    cost = {t: count(_asked(questions[0], [t])) - base for t in set(texts)}
    out = []
    for j, (question, tokens) in enumerate(zip(questions, lengths, strict=True)):
        first = j * len(texts) // len(questions) if rotate else 0
        chosen, left, added = [], tokens - count(_asked(question, [])), True
        while added:  # passes over the texts until none fits
            added = False
            for t in texts[first:] + texts[:first]:
                if 0 < cost[t] <= left:
                    chosen.append(t)
                    left -= cost[t]
                    added = True
        while chosen and count(_asked(question, chosen)) > tokens:
            chosen.pop()
        out.append(_asked(question, chosen))
    return out
