"""The engine over the programs, and the `dflash generate` CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_et import cli
from dflash_et.checkpoint import load_pair
from dflash_et.engine import Engine
from dflash_et.generate import generate_ar
from dflash_et.prompts import builtin_prompts, encode_chat, tokenizer


@pytest.fixture(scope="module")
def engine(programs):
    return Engine(programs)


@pytest.fixture(scope="module")
def prompts(pair):
    tok = tokenizer(pair[0])
    return [encode_chat(tok, r["prompt"]) for r in builtin_prompts(6)]


def test_engine_reads_limits_from_programs(engine):
    assert (engine.max_seq_len, engine.chunk, engine.eos_ids) == (128, 16, {0, 2})
    assert (engine.mask_token_id, engine.max_block_size) == (5, 16)


def test_engine_dflash_matches_eager_reference(engine, pair, prompts):
    target, _, _ = load_pair(*pair, max_seq_len=128)
    for ids in prompts:
        reference = generate_ar(target, ids, 24, {0, 2}, 128, 16).tokens
        assert engine.ar(ids, 24).tokens == reference
        for block in (2, 5, 16):
            out = engine.dflash(ids, 24, block)
            assert out.tokens == reference
            assert all(r.draft_s > 0 and r.verify_s > 0 and r.host_s >= 0 for r in out.rounds if r.proposed)


def test_engine_stops_at_eos(engine, prompts, monkeypatch):
    reference = engine.ar(prompts[0], 30).tokens
    monkeypatch.setattr(engine, "eos_ids", {reference[9]})
    expected = reference[:reference.index(reference[9]) + 1]
    assert engine.ar(prompts[0], 30).tokens == expected
    assert engine.dflash(prompts[0], 30).tokens == expected


def test_engine_edges_of_the_cache_and_budget(engine, prompts):
    long_prompt = (prompts[0] * 4)[:125]  # 3 positions left in a 128-position cache
    out = engine.dflash(long_prompt, 50)
    assert out.tokens == engine.ar(long_prompt, 50).tokens and len(out.tokens) == 4
    assert len(engine.dflash(prompts[1], 3).tokens) == 3
    with pytest.raises(ValueError, match="the prompt has 130 tokens but max_seq_len is 128"):
        engine.dflash((prompts[0] * 5)[:130], 8)


def test_engine_refuses_blocks_the_draft_was_not_exported_for(engine, prompts):
    with pytest.raises(ValueError, match=r"outside 2..16.*export.max_block_size=32"):
        engine.dflash(prompts[0], 8, block_size=32)


def run_cli(capsys, *args):
    cli.main(["generate", *args])
    return capsys.readouterr()


def test_cli_json_dflash_equals_ar(programs, pair, capsys):
    common = ["--prompt", "Ada has 3 apples and buys 4 more.", "--programs", str(programs),
              "--tokenizer", str(pair[0]), "--max-new-tokens", "20", "--json"]
    dflash = json.loads(run_cli(capsys, *common).out)
    ar = json.loads(run_cli(capsys, *common, "--ar").out)
    assert dflash["tokens"] == ar["tokens"] and len(ar["tokens"]) == 20
    assert set(dflash) == {"tokens", "text", "tau", "tokens_per_s"}
    assert dflash["text"] == tokenizer(pair[0]).decode(ar["tokens"], skip_special_tokens=True)
    assert ar["tau"] == 1.0 and dflash["tokens_per_s"] > 0
    small = json.loads(run_cli(capsys, *common, "--block-size", "3").out)
    assert small["tokens"] == ar["tokens"]


def test_cli_streams_text_and_reports(programs, pair, capsys):
    out = run_cli(capsys, "--prompt", "Write a Python function add(a, b) that returns a + b.", "--programs",
                  str(programs), "--tokenizer", str(pair[0]), "--max-new-tokens", "12")
    text = json.loads(run_cli(capsys, "--prompt", "Write a Python function add(a, b) that returns a + b.", "--programs",
                              str(programs), "--tokenizer", str(pair[0]), "--max-new-tokens", "12", "--json").out)["text"]
    assert out.out == text + "\n"
    assert "[dflash] 12 tokens, tau 1." in out.err and "tokens/s" in out.err


def test_cli_errors_are_one_line(tmp_path, pair):
    r = subprocess.run([str(Path(sys.executable).parent / "dflash"), "generate", "--prompt", "hi",
                        "--programs", str(tmp_path), "--tokenizer", str(pair[0])], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path}/target.pte does not exist; run `dvc repro` (or `dvc pull`) to build the programs")


def test_cli_help_is_complete():
    r = subprocess.run([str(Path(sys.executable).parent / "dflash"), "generate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for option in ("--prompt", "--programs", "--tokenizer", "--ar", "--block-size", "--max-new-tokens", "--json"):
        assert option in r.stdout
