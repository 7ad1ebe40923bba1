"""Prompt sets for validation and benchmarking, rendered with the target's own chat template."""

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from dflash_et.data.corpus import samples

PROMPT_SEED = 1234  # not the corpus seed the built-in models are made from


def builtin_prompts(n: int, seed: int = PROMPT_SEED, split: str = "eval") -> list[dict]:
    """`n` prompts written for this project, cycling through the math, code and chat categories.
    Measurements use `eval` prompts, which no draft trains on (see corpus.split_of)."""
    return [{"category": c, "prompt": p} for c, p, _ in samples(n, seed=seed, split=split)]


# Benchmark sets on the Hugging Face hub, by short name: (dataset, config, split).
DATASETS = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "humaneval": ("openai/openai_humaneval", None, "test"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
}


def load_prompts(source: str, n: int) -> list[dict]:
    """The first `n` prompts of `source`: `builtin`, a JSONL file, a hub benchmark by name
    (gsm8k, humaneval, mt-bench) or any dataset as `hf:<repo or dir>[:config][@split]`.

    A row's text is its `prompt`, `question` or first of `turns`; its category is its `category`
    field, else the source's name.
    """
    if source == "builtin":
        return builtin_prompts(n)
    if source in DATASETS or source.startswith("hf:"):
        return _dataset_prompts(source, n)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"prompts {source!r}: not 'builtin', a JSONL file, 'hf:<dataset>' or one of {sorted(DATASETS)}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [_prompt_row(row, "file", f"{path}:{i + 1}") for i, row in enumerate(rows[:n])]


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
    text = row.get("prompt") or row.get("question") or row.get("turns")
    if isinstance(text, list):
        text = text[0] if text else None
    if not text:
        raise ValueError(f"{where}: no 'prompt', 'question' or 'turns' field")
    return {"category": row.get("category") or category, "prompt": text}


def tokenizer(target_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(target_dir)


def encode_chat(tok: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """One user turn through the chat template, generation prompt added, Qwen3 thinking off."""
    if tok.chat_template is None:
        return tok.encode(prompt)
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    return tok.encode(text, add_special_tokens=False)
