"""Sampled DFlash through the exported programs: same distribution as plain sampling of target.pte,
seeded, with the checkpoint's recommended settings carried by target.pte; the CLI and bench over it."""

import json
import math
from dataclasses import replace

import pytest

from dflash_et import cli
from dflash_et.checkpoints import builtin
from dflash_et.checkpoints.load import recommended_sampling
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts
from dflash_et.evaluate.bench import BenchConfig, run_bench
from dflash_et.evaluate.same_distribution import SamplingCheck, check_sampling
from dflash_et.runtime import sampling
from dflash_et.errors import ProgramError
from dflash_et.runtime import engine as engine_module
from dflash_et.runtime.engine import Engine
from dflash_et.runtime.programs import load_programs
from dflash_et.runtime.sampling import Sampler, Sampling


SAMPLES = 500  # completions per prompt and proposal mode


def load(programs_dir) -> tuple:
    """(target, draft) programs, the builtin prompts encoded, and their labels: what `check` takes."""
    pair = load_programs(programs_dir)
    tok = tokenizer(programs_dir)
    rows = builtin_prompts(3)
    return pair, [encode_chat(tok, r["prompt"]) for r in rows], [r["prompt"][:30] for r in rows]


@pytest.fixture(scope="module")
def loaded(programs):
    return load(programs)


def check(loaded, **settings) -> dict:
    (target, draft), prompts, labels = loaded
    return check_sampling((target, draft), prompts, labels, set(target.meta.eos_ids),
                          draft.meta.mask_token_id, SamplingCheck(**settings))


def test_sampled_dflash_has_the_distribution_of_plain_sampling(loaded):
    """500 DFlash completions of a prompt per mode (argmax and sampled proposals), 6 tokens each, against target.pte's
    exact distribution after each prefix.

    The tolerance: each of the 12 chi-square tests (2 modes x tokens 1..6) must have p >= 1e-3 / 12, so
    correct sampling fails with probability < 1e-3 (and with fixed seeds, never twice differently); the next
    tests show the same check catching a wrong acceptance rule. The total variation of n samples from the
    distribution they are drawn from is itself noise, about 0.5 * sqrt((k - 1) / n) over k tokens (0.097 for top-k 20
    and 500 samples): the largest of the 12 positions' may exceed that, not half as much again."""
    report = check(loaded, samples=SAMPLES, prompts=1)
    assert report["tests"] == 12 and report["threshold"] == pytest.approx(1e-3 / 12)
    assert report["same_distribution"], report
    assert report["max_total_variation"] < 1.5 * 0.5 * math.sqrt((SamplingCheck().top_k - 1) / SAMPLES)


RIGHT = sampling.acceptance
WRONG_RULES = {"accept-everything": lambda p, q, x: 1.0, "accept-half-as-often": lambda p, q, x: 0.5 * RIGHT(p, q, x)}


@pytest.mark.parametrize("wrong", WRONG_RULES.values(), ids=WRONG_RULES.keys())
def test_the_check_catches_a_wrong_acceptance_rule(loaded, monkeypatch, wrong):
    """With the samples the check above takes (200 were too few on some machines' trained pair: accepting half as
    often reached p = 1e-4, short of the 8.3e-5 threshold)."""
    monkeypatch.setattr(sampling, "acceptance", wrong)
    report = check(loaded, samples=SAMPLES, prompts=1)
    assert not report["same_distribution"] and report["min_p_value"] < 1e-6, report


def test_a_seed_fixes_the_tokens(programs, loaded):
    engine = Engine(programs)
    _, prompts, _ = loaded
    for proposals in ("argmax", "sample"):
        s = Sampling(1.0, top_p=0.9, proposals=proposals, seed=11)
        runs = [[engine.dflash(ids, 16, sampler=Sampler(s)).tokens for ids in prompts] for _ in range(2)]
        assert runs[0] == runs[1]
        other = [engine.dflash(ids, 16, sampler=Sampler(Sampling(1.0, top_p=0.9, proposals=proposals, seed=12))).tokens
                 for ids in prompts]
        assert other != runs[0]
    assert [engine.ar(ids, 16, sampler=Sampler(s)).tokens for ids in prompts] == \
        [engine.ar(ids, 16, sampler=Sampler(s)).tokens for ids in prompts]


def test_programs_carry_the_recommended_settings(programs, trained_pair):
    engine = Engine(programs)
    expected = builtin.RECOMMENDED_SAMPLING["qwen3"]
    assert recommended_sampling(trained_pair[0]) == expected
    assert {k: getattr(engine.target.meta, k) for k in expected} == expected
    assert engine.recommended(seed=3) == Sampling(**expected, seed=3)
    assert engine.recommended(temperature=0.0).greedy


def test_recommended_settings_follow_transformers(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_p": 0.95}))
    assert recommended_sampling(tmp_path) == {"temperature": 1.0, "top_p": 0.95, "top_k": 50}  # generate's defaults
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "eos_token_id": 2}))
    assert recommended_sampling(tmp_path) == {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # do_sample unset: greedy
    (tmp_path / "generation_config.json").unlink()
    assert recommended_sampling(tmp_path)["temperature"] == 0.0


def run_cli(capsys, *args) -> list[str]:
    cli.main(["generate", *args])
    return capsys.readouterr().out.splitlines()


def test_cli_samples_seeded_completions(programs, capsys, monkeypatch):
    def no_curve(*args, **kwargs):  # sampled, auto keeps the largest block: timing the device would be wasted
        raise AssertionError("a sampled generation measured a cost curve")

    monkeypatch.setattr(engine_module, "measure_cost_curve", no_curve)
    common = ["--prompt", "Dan has 52 apples and buys 3 more. How many apples does Dan have now?",
              "--programs", str(programs), "--max-new-tokens", "20", "--json"]
    lines = run_cli(capsys, *common, "--sample", "--num-samples", "4", "--seed", "5")
    samples = [json.loads(line) for line in lines]
    assert len(samples) == 4 and all(set(s) == {"tokens", "text", "tau", "tokens_per_s", "seed"} for s in samples)
    assert [s["seed"] for s in samples] == [5, 6, 7, 8] and len({tuple(s["tokens"]) for s in samples}) > 1
    again = run_cli(capsys, *common, "--sample", "--num-samples", "4", "--seed", "5")
    assert [json.loads(line)["tokens"] for line in again] == [s["tokens"] for s in samples]
    alone = run_cli(capsys, *common, "--sample", "--seed", "7")  # any one completion, from its own seed
    assert json.loads(alone[0])["tokens"] == samples[2]["tokens"]
    explicit = run_cli(capsys, *common, "--temperature", "0.7", "--top-p", "0.8", "--top-k", "20", "--seed", "5")
    assert json.loads(explicit[0])["tokens"] == samples[0]["tokens"]  # --sample is the recommended 0.7 / 0.8 / 20
    ar = run_cli(capsys, *common, "--ar", "--temperature", "1", "--proposals", "sample", "--seed", "1")
    assert json.loads(ar[0])["tau"] == 1.0


def test_cli_streams_each_sample(programs, capsys):
    cli.main(["generate", "--prompt", "Write a Python function add(a, b) that returns a + b.",
              "--programs", str(programs), "--max-new-tokens", "8", "--temperature", "0.8", "--num-samples", "2",
              "--seed", "9"])
    out = capsys.readouterr()
    assert out.out.startswith("--- sample 1 of 2 ---\n") and "--- sample 2 of 2 ---\n" in out.out
    assert "(temperature 0.8, top-p 1, top-k off, seed 9)" in out.err and "top-k off, seed 10)" in out.err


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "error: temperature must be 0 (greedy) or a positive number, got -1.0"),
    (["--temperature", "1", "--top-p", "0"], "error: top_p must be in (0, 1], got 0.0; 1 turns top-p off"),
    (["--sample", "--top-k", "0"], "error: top_k must be at least 1, got 0; leave it unset to turn top-k off"),
    (["--top-p", "0.9"], "error: --top-p and --top-k shape sampling: give --temperature too, or --sample for the "
                         "checkpoint's recommended settings"),
    (["--num-samples", "0"], "error: --num-samples must be at least 1, got 0"),
])
def test_cli_bad_settings_are_one_line_errors(tmp_path, capsys, args, message):
    """`sys.exit(message)`: the message on stderr, exit status 1 (test_engine runs the binary once to show it).
    The flags are checked before any program is loaded: here there are none."""
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--prompt", "hi", "--programs", str(tmp_path), *args])
    assert e.value.code == message and capsys.readouterr().out == ""


def test_bench_at_the_recommended_settings(programs):
    """(bench.temperature=0.7 runs through DVC in test_pipeline's experiment)"""
    metrics, _, _ = run_bench(programs, 8, BenchConfig(num_prompts=3, max_new_tokens=12, latency_repeats=1,
                                                     temperature="recommended", proposals="sample",
                                                     block_sizes=(8,)))
    assert metrics["sampling"] == {**builtin.RECOMMENDED_SAMPLING["qwen3"], "proposals": "sample", "seed": 0}
    assert "lossless" not in metrics  # token equality is a greedy check
    assert metrics["tau"] > 1 and metrics["speedup"] > 0


def test_bench_refuses_bad_settings_before_loading(tmp_path):
    with pytest.raises(ValueError, match="top_k must be at least 1"):
        run_bench(tmp_path, 8, BenchConfig(temperature=0.7, top_k=0))
    with pytest.raises(ValueError, match="bench.temperature must be a number or 'recommended', got 'hot'"):
        run_bench(tmp_path, 8, BenchConfig(temperature="hot"))


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=0.0), "validate.sampling.temperature must be positive (the check compares sampled "
                            "distributions), got 0.0"),
    (dict(top_p=2.0), "top_p must be in (0, 1], got 2.0; 1 turns top-p off"),
    (dict(samples=0), "validate.sampling.samples must be at least 1, got 0"),
    (dict(tokens=1), "validate.sampling.tokens must be at least 2, got 1"),
    (dict(alpha=1.0), "validate.sampling.alpha must be in (0, 1), got 1.0"),
])
def test_bad_validate_sampling_settings_fail_before_any_work(bad, message):
    from dflash_et.evaluate.validate import ValidateConfig

    with pytest.raises(ValueError) as e:
        ValidateConfig.from_params({"sampling": bad})
    assert str(e.value) == message


def test_programs_without_sampling_metadata_are_a_clear_error(programs, monkeypatch):
    engine = Engine(programs)
    monkeypatch.setattr(engine.target, "meta", replace(engine.target.meta, temperature=None))
    with pytest.raises(ProgramError, match="carries no recommended sampling settings .*re-export it"):
        engine.recommended()


def test_sample_on_a_greedy_checkpoint_says_so(programs, monkeypatch, capsys):
    monkeypatch.setattr(Engine, "recommended", lambda self, **flags: Sampling(seed=flags["seed"]))
    cli.main(["generate", "--prompt", "hi", "--programs", str(programs), "--max-new-tokens", "4", "--sample"])
    err = capsys.readouterr().err
    assert "recommends greedy decoding" in err and "(greedy)" in err


def test_the_sampling_check_needs_a_prompt(loaded):
    (target, draft), _, _ = loaded
    with pytest.raises(ValueError, match="needs at least one prompt"):
        check_sampling((target, draft), [], [], set(), 0, SamplingCheck())
