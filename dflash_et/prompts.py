"""Prompt sets for validation and benchmarking, rendered with the target's own chat template."""

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from dflash_et.corpus import samples

PROMPT_SEED = 1234  # not the corpus seed the built-in models are made from


def builtin_prompts(n: int) -> list[dict]:
    """`n` prompts written for this project, cycling through the math, code and chat categories."""
    return [{"category": c, "prompt": p} for c, p, _ in samples(n, seed=PROMPT_SEED)]


def load_prompts(source: str, n: int) -> list[dict]:
    """`builtin`, or a JSONL file with a `prompt` (or `question`/`turns`) field and an optional `category`."""
    if source == "builtin":
        return builtin_prompts(n)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"prompts {source!r}: not 'builtin' and no such JSONL file")
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        text = row.get("prompt") or row.get("question") or (row.get("turns") or [None])[0]
        if not text:
            raise ValueError(f"{path}:{i + 1}: no 'prompt', 'question' or 'turns' field")
        rows.append({"category": row.get("category", "file"), "prompt": text})
    return rows[:n]


def tokenizer(target_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(target_dir)


def encode_chat(tok: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """One user turn through the chat template, generation prompt added, Qwen3 thinking off."""
    if tok.chat_template is None:
        return tok.encode(prompt)
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    return tok.encode(text, add_special_tokens=False)
