"""The `assistant` prompt set: every category in both splits, eval disjoint from train (no shared prompt,
no shared 8-word run once the shared phrasing is taken out), the committed JSONL exactly what its generator
writes, and its conversations carried whole by load_prompts and encode_chat."""

import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dflash_et.checkpoints.builtin import build_tokenizer
from dflash_et.data.corpus import SPLITS
from dflash_et.data.chat import encode_chat
from dflash_et.data.prompts import ASSISTANT_PROMPTS, load_prompts

GENERATOR = Path(__file__).resolve().parent.parent / "tools" / "make_assistant_prompts.py"
CATEGORIES = ("math", "code", "chat", "summarize", "rewrite", "multi-turn")
ROWS = [json.loads(line) for line in ASSISTANT_PROMPTS.read_text(encoding="utf-8").splitlines()]
RUN = 8  # words: a shared run this long means an eval prompt repeats train content


def of_split(split: str) -> list[dict]:
    return [r for r in ROWS if r["split"] == split]


def prompt_key(row: dict) -> str:
    return json.dumps(row.get("prompt") or row["messages"], ensure_ascii=False)


def texts(row: dict) -> list[str]:
    return [row["prompt"]] if "prompt" in row else [m["content"] for m in row["messages"]]


def phrasing_patterns() -> list[re.Pattern]:
    """The generator's shared phrasings as patterns whose groups are their content slots, the most
    specific (most literal text) first, so that "{} Show your working." wins over "{}"."""
    spec = importlib.util.spec_from_file_location("make_assistant_prompts", GENERATOR)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    literals = [re.split(r"\{\w*\}", phrasing) for phrasing in generator.SHARED_PHRASINGS]
    literals.sort(key=lambda parts: -sum(map(len, parts)))
    return [re.compile("(.+?)".join(map(re.escape, parts)), re.S) for parts in literals]


def content_runs(row: dict, patterns: list[re.Pattern]) -> set[tuple[str, ...]]:
    """The row's content, its shared phrasing taken out, as word runs: every RUN-word run, or a whole
    piece shorter than that. Numbers all read as 0, so a row copied with its numbers changed has the
    same runs."""
    runs = set()
    for text in texts(row):
        match = next((m for p in patterns if (m := p.fullmatch(text))), None)
        for piece in match.groups() if match else [text]:
            words = re.findall(r"\w+", re.sub(r"\d+", "0", piece.lower()))
            n = min(RUN, len(words))
            runs |= {tuple(words[i:i + n]) for i in range(len(words) - n + 1)} if words else set()
    return runs


def test_every_category_has_enough_rows_in_both_splits():
    counts = Counter((r["split"], r["category"]) for r in ROWS)
    assert set(counts) == {(s, c) for s in SPLITS for c in CATEGORIES}
    assert len(of_split("train")) >= 800 and len(of_split("eval")) >= 80
    for category in CATEGORIES:  # roughly even: none below 130 train / 14 eval of ~147 / ~16
        assert counts["train", category] >= 130 and counts["eval", category] >= 14, category


def test_rows_are_well_formed_and_no_prompt_repeats():
    for row in ROWS:
        if row["category"] == "multi-turn":
            assert row.keys() == {"category", "split", "messages"}, row
            assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user"], row
            assert all(m.keys() == {"role", "content"} and m["content"].strip() for m in row["messages"]), row
        else:
            assert row.keys() == {"category", "split", "prompt"} and row["prompt"].strip(), row
        if row["category"] == "summarize":  # the paragraph to summarize is in the prompt
            assert 60 <= max(len(block.split()) for block in row["prompt"].split("\n\n")) <= 120, row
    assert len({prompt_key(r) for r in ROWS}) == len(ROWS)


def test_eval_prompts_share_no_content_with_train():
    patterns = phrasing_patterns()
    train, held_out = of_split("train"), of_split("eval")
    assert not {prompt_key(r) for r in train} & {prompt_key(r) for r in held_out}
    train_runs = set().union(*(content_runs(r, patterns) for r in train))
    leaks = [(" ".join(run), prompt_key(r)[:80]) for r in held_out for run in content_runs(r, patterns) & train_runs]
    assert not leaks
    # The check has teeth: every eval row, copied into train with its numbers changed, would be caught.
    for row in held_out:
        copy = json.loads(re.sub(r"\d", lambda d: str((int(d[0]) + 1) % 10), json.dumps(row, ensure_ascii=False)))
        assert content_runs(copy, patterns) & content_runs(row, patterns), row


def test_committed_file_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "assistant_prompts.jsonl"
    subprocess.run([sys.executable, str(GENERATOR), "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == ASSISTANT_PROMPTS.read_bytes()


@pytest.mark.parametrize("split", SPLITS)
def test_load_prompts_gives_the_first_rows_of_the_split(split):
    rows = load_prompts("assistant", 12, split=split)
    expected = of_split(split)[:12]
    assert rows == [{"category": r["category"], "prompt": r.get("prompt") or r["messages"]} for r in expected]
    assert {r["category"] for r in rows[:6]} == set(CATEGORIES)  # interleaved: a few rows cover every category
    assert all(isinstance(r["prompt"], list) for r in rows if r["category"] == "multi-turn")


def test_a_conversation_is_rendered_whole_with_the_generation_prompt():
    tok = build_tokenizer()
    messages = next(r["prompt"] for r in load_prompts("assistant", 12) if isinstance(r["prompt"], list))
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert tok.decode(encode_chat(tok, messages)) == turns + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert encode_chat(tok, messages[0]["content"]) == encode_chat(tok, messages[:1])  # a string: one user turn
    tok.chat_template = None
    assert encode_chat(tok, messages) == tok.encode("\n".join(m["content"] for m in messages))


def test_a_file_with_split_fields_gives_each_split_its_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "how are you?"}]
    rows = [{"prompt": "t", "split": "train"}, {"prompt": "e", "split": "eval"}, {"prompt": "any"},
            {"messages": conversation, "split": "eval", "category": "multi-turn"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_prompts(str(path), 10, split="train") == [{"category": "file", "prompt": "t"},
                                                          {"category": "file", "prompt": "any"}]
    assert load_prompts(str(path), 10) == [{"category": "file", "prompt": "e"}, {"category": "file", "prompt": "any"},
                                           {"category": "multi-turn", "prompt": conversation}]
    assert [r["prompt"] for r in load_prompts(str(path), 2)] == ["e", "any"]  # n counts rows of the split


def test_unknown_splits_sources_and_bad_conversations_are_refused(tmp_path):
    with pytest.raises(ValueError, match="split 'test' is not one of"):
        load_prompts("assistant", 3, split="test")
    with pytest.raises(ValueError, match="or one of .*'assistant'"):
        load_prompts("no-such-set", 3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}))
    with pytest.raises(ValueError, match="bad.jsonl:1: 'messages' must be .* ending on a user turn"):
        load_prompts(str(bad), 3)
