"""The engine over the programs, and the `dflash generate` CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_et import cli
from dflash_et.checkpoints.pair import load_pair
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts
from dflash_et.errors import REBUILD
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.engine import Engine
from dflash_et.runtime.generate import generate_ar
from dflash_et.runtime.sampling import Sampler, Sampling
from tests.tiny_checkpoints import checkpoint_facts
from tests.tiny_programs import MAX_SEQ_LEN, PREFILL_CHUNK


@pytest.fixture(scope="module")
def engine(programs):
    return Engine(programs)


@pytest.fixture(scope="module")
def facts(trained_pair):
    return checkpoint_facts(trained_pair)


@pytest.fixture(scope="module")
def prompts(programs):
    tok = tokenizer(programs)
    return [encode_chat(tok, r["prompt"]) for r in builtin_prompts(6)]


def test_engine_reads_limits_from_programs(engine, facts):
    assert (engine.max_context_len, engine.chunk, engine.eos_ids) == (MAX_SEQ_LEN, PREFILL_CHUNK, set(facts["eos_ids"]))
    assert (engine.mask_token_id, engine.max_block_size) == (facts["mask_token_id"], facts["block_size"])


def test_engine_dflash_matches_eager_reference(engine, trained_pair, prompts, facts):
    target, _, _ = load_pair(*trained_pair, max_seq_len=MAX_SEQ_LEN)
    eos = set(facts["eos_ids"])
    for ids in prompts:
        reference = generate_ar(target, ids, 24, eos, MAX_SEQ_LEN, PREFILL_CHUNK).tokens
        assert engine.ar(ids, 24).tokens == reference
        for block in (2, 5, facts["block_size"]):
            out = engine.dflash(ids, 24, block)
            assert out.tokens == reference
            assert all(r.draft_s > 0 and r.verify_s > 0 and r.host_s >= 0 for r in out.rounds if r.verified)


def test_engine_stops_at_eos(engine, prompts, monkeypatch):
    reference = engine.ar(prompts[0], 30).tokens
    monkeypatch.setattr(engine, "eos_ids", {reference[9]})
    expected = reference[:reference.index(reference[9]) + 1]
    assert engine.ar(prompts[0], 30).tokens == expected
    assert engine.dflash(prompts[0], 30).tokens == expected


def test_engine_edges_of_the_cache_and_budget(engine, prompts, monkeypatch):
    monkeypatch.setattr(engine, "eos_ids", set())  # the trained target would otherwise end some replies first
    long_prompt = (prompts[0] * 8)[:MAX_SEQ_LEN - 3]  # 3 positions left in the cache
    out = engine.dflash(long_prompt, 50)
    assert out.tokens == engine.ar(long_prompt, 50).tokens and len(out.tokens) == 4
    assert len(engine.dflash(prompts[1], 3).tokens) == 3
    with pytest.raises(ValueError, match=f"the prompt has {MAX_SEQ_LEN + 2} tokens but max_seq_len is {MAX_SEQ_LEN}"):
        engine.dflash((prompts[0] * 10)[:MAX_SEQ_LEN + 2], 8)


def test_engine_refuses_blocks_the_draft_was_not_exported_for(engine, prompts, facts):
    with pytest.raises(ValueError, match=rf"outside 2..{facts['block_size']}.*use block_size auto, or at most "):
        engine.dflash(prompts[0], 8, block_size=32)
    with pytest.raises(ValueError, match="block_size must be a number of tokens or auto, got 'big'"):
        engine.dflash(prompts[0], 8, block_size="big")


def test_engine_auto_is_lossless_and_learns_across_generations(programs, engine, prompts, tmp_path):
    """auto over the trained pair's programs: plain greedy's tokens, proposals accepted, and one planner
    carrying what it learned from one generation to the next. The cost curve is given (a target call of t tokens
    costs 1 + 0.05 t plain steps, a draft call 0.2), so what auto does is decided by the draft, not by how fast
    this machine is (on CI's, a curve measured under load made it fall back: 25 accepted in 100 rounds)."""
    b = engine.max_block_size
    curve = CostCurve([0, 1000], [[1 + 0.05 * t for t in range(b)]] * 2, [[0.2] * (b - 1)] * 2, engine.identity)
    (tmp_path / "curve.json").write_text(json.dumps(curve.to_dict()))
    graded = Engine(programs, tmp_path / "curve.json")
    outs = [graded.dflash(ids, 24, "auto") for ids in prompts]
    assert [o.tokens for o in outs] == [engine.ar(ids, 24).tokens for ids in prompts]
    rounds = [r for o in outs for r in o.rounds]
    accepted = sum(r.accepted for r in rounds)
    assert accepted > len(rounds), (accepted, len(rounds))  # the trained draft is used, not fallen back from
    assert all(r.verified <= r.drafted < b for r in rounds)
    drafted = sum(1 for r in rounds if r.drafted)  # each counted once the next round shows whether its reply went on
    planner = graded.planner()
    assert planner is graded.planner() and drafted > len(prompts) and math.isfinite(planner.learned()[0])  # one
    # planner for all generations, which chose verify counts by what it learned (test_adaptive: what it learns)


def test_engine_sampled_auto_keeps_the_largest_block_so_seeds_reproduce(engine, prompts):
    sampled = engine.dflash(prompts[0], 24, "auto", sampler=Sampler(Sampling(0.8, seed=3)))
    assert sampled.rounds[0].drafted == engine.max_block_size - 1 and all(r.drafted for r in sampled.rounds)
    assert sampled.tokens == engine.dflash(prompts[0], 24, sampler=Sampler(Sampling(0.8, seed=3))).tokens


def run_cli(capsys, *args):
    cli.main(["generate", *args])
    return capsys.readouterr()


def test_cli_json_dflash_equals_ar(programs, capsys):
    common = ["--prompt", "Ada has 3 apples and buys 4 more.", "--programs", str(programs),
              "--max-new-tokens", "20", "--json"]
    dflash = json.loads(run_cli(capsys, *common).out)
    ar = json.loads(run_cli(capsys, *common, "--ar").out)
    eos = set(Engine(programs).eos_ids)
    assert dflash["tokens"] == ar["tokens"] and (len(ar["tokens"]) == 20 or ar["tokens"][-1] in eos)
    assert set(dflash) == {"tokens", "text", "tau", "tokens_per_s"}
    assert dflash["text"] == tokenizer(programs).decode(ar["tokens"], skip_special_tokens=True)
    assert ar["tau"] == 1.0 and dflash["tokens_per_s"] > 0
    small = json.loads(run_cli(capsys, *common, "--block-size", "3").out)
    assert small["tokens"] == ar["tokens"]


def test_cli_reuses_a_cost_curve_of_these_programs_only(programs, tmp_path, capsys):
    """--cost-curve takes the bench's file for these programs and refuses one of other programs, in one line."""
    engine = Engine(programs)
    curve = tmp_path / "cost_curve.json"
    measured = engine.cost_curve(repeats=1)
    assert measured.programs == engine.identity and measured.max_block == engine.max_block_size
    curve.write_text(json.dumps(measured.to_dict()))
    common = ["--prompt", "Ada has 3 apples.", "--programs", str(programs), "--max-new-tokens", "12", "--json"]
    reused = json.loads(run_cli(capsys, *common, "--cost-curve", str(curve)).out)
    assert reused["tokens"] == json.loads(run_cli(capsys, *common, "--ar").out)["tokens"]
    curve.write_text(json.dumps({**engine.cost_curve().to_dict(), "programs": "other"}))
    with pytest.raises(SystemExit, match="measured on other programs than these; rerun the bench stage"):
        run_cli(capsys, *common, "--cost-curve", str(curve))
    with pytest.raises(SystemExit):
        run_cli(capsys, *common, "--block-size", "sixteen")
    assert "must be a number of tokens or auto, got 'sixteen'" in capsys.readouterr().err


def test_cli_streams_text_and_reports(programs, pair, capsys):
    """The tokenizer comes from the programs directory by default, or from --tokenizer."""
    common = ["--prompt", "Write a Python function add(a, b) that returns a + b.", "--programs", str(programs),
              "--max-new-tokens", "12"]
    out = run_cli(capsys, *common)
    text = json.loads(run_cli(capsys, *common, "--tokenizer", str(pair[0]), "--json").out)["text"]
    assert out.out == text + "\n"
    assert "[dflash] 12 tokens, tau " in out.err and "tokens/s" in out.err


def test_cli_errors_are_one_line(tmp_path, pair):
    r = subprocess.run([str(Path(sys.executable).parent / "dflash"), "generate", "--prompt", "hi",
                        "--programs", str(tmp_path), "--tokenizer", str(pair[0])], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path}/target.pte is missing: {REBUILD}")


def test_cli_help_is_complete():
    r = subprocess.run([str(Path(sys.executable).parent / "dflash"), "generate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for option in ("--prompt", "--programs", "--tokenizer", "--ar", "--block-size", "--cost-curve", "--max-new-tokens",
                   "--json"):
        assert option in r.stdout
