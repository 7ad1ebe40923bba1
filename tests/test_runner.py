"""The C++ runner (runner/): its kernels against ExecuTorch's own ops, its tokens against the Python
engine's, its errors. It is built once per test run, as `make runner` builds it (conftest's `runner`)."""

import json
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_et import cli
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts
from dflash_et.errors import REBUILD, ProgramError, UserError
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.cpp_runner import CppEngine
from runner.bindings import LlamaKernels
from dflash_et.runtime.engine import Engine
from dflash_et.runtime.programs import DFlash2DraftProgram, load_programs
from dflash_et.runtime.sampling import Sampler, Sampling
from tests.tiny_programs import MAX_SEQ_LEN


# ---------------------------------------------------------------------------------------------- kernels

@pytest.fixture(scope="module")
def kernels(runner):
    return LlamaKernels(runner.parent / "libdflash_llama_ops.so")


def reference_sdpa(q, k, v, start, causal, scale, mask=None):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers torch.ops.llama)

    return torch.ops.llama.custom_sdpa(q, k, v, start, mask, 0.0, causal, scale)


@pytest.mark.parametrize("heads", [(8, 2), (4, 4)])  # (query heads, kv heads): GQA 4:1, and none
@pytest.mark.parametrize("head_dim,queries,start", [(64, 1, 0), (64, 16, 37), (24, 5, 90), (24, 1, 122)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", [None, 0.125])
def test_custom_sdpa_matches_executorch(kernels, heads, head_dim, queries, start, causal, scale):
    torch.manual_seed(start + queries)
    q = torch.randn(1, queries, heads[0], head_dim)
    k, v = torch.randn(2, 1, MAX_SEQ_LEN, heads[1], head_dim)
    ours = kernels.custom_sdpa(q, k, v, start, causal, scale)
    torch.testing.assert_close(ours, reference_sdpa(q, k, v, start, causal, scale), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("start,queries", [(0, 1), (40, 16), (100, 5), (MAX_SEQ_LEN + 30, 4)])
def test_custom_sdpa_with_a_sliding_window_mask(kernels, start, queries):
    """Sliding-window layers pass an additive mask over the whole cache (and is_causal false); with a
    ring-buffer cache, positions run past the cache's length."""
    torch.manual_seed(start)
    q = torch.randn(1, queries, 8, 64)
    k, v = torch.randn(2, 1, MAX_SEQ_LEN, 2, 64)
    rows, keys = torch.arange(start, start + queries)[:, None], torch.arange(MAX_SEQ_LEN)[None]
    window = (keys <= rows) & (keys > rows - 7) if start < MAX_SEQ_LEN else (keys - rows) % 11 == 0  # ring slots
    mask = torch.where(window, 0.0, float("-inf"))
    expected = reference_sdpa(q, k, v, start, False, None, mask)
    torch.testing.assert_close(kernels.custom_sdpa(q, k, v, start, False, None, mask), expected, atol=2e-5, rtol=1e-4)
    with pytest.raises(RuntimeError, match="custom_sdpa failed"):  # a mask and is_causal: refused, as ExecuTorch does
        kernels.custom_sdpa(q, k, v, start, True, None, mask)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("start,queries", [(700, 1), (1290, 16), (1024, 9)])
def test_custom_sdpa_over_long_caches_is_executorchs_and_row_exact(kernels, masked, start, queries):
    """Caches of many key tiles, causal or under a window that masks most of them: ExecuTorch's numbers, and each
    row's bits those of a one-query call at its position (a row's softmax and sums run alike in any call)."""
    torch.manual_seed(start + masked)
    cache = 1400
    q = torch.randn(1, queries, 9, 64)
    k, v = torch.randn(2, 1, cache, 3, 64)
    rows, keys = torch.arange(start, start + queries)[:, None], torch.arange(cache)[None]
    mask = torch.where((keys <= rows) & (keys > rows - 300), 0.0, float("-inf")) if masked else None

    def ours(lo: int, hi: int) -> torch.Tensor:
        return kernels.custom_sdpa(q[:, lo:hi].contiguous(), k, v, start + lo, not masked, None,
                                   None if mask is None else mask[lo:hi].contiguous())

    expected = reference_sdpa(q, k, v, start, not masked, None, mask)
    torch.testing.assert_close(ours(0, queries), expected, atol=2e-5, rtol=1e-4)
    assert torch.equal(ours(0, queries), torch.cat([ours(i, i + 1) for i in range(queries)], 1))


def test_custom_sdpa_in_bfloat16(kernels):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 8, 64, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, 64, 2, 64, dtype=torch.bfloat16)
    ours = kernels.custom_sdpa(q, k, v, 20, True, None)
    torch.testing.assert_close(ours, reference_sdpa(q, k, v, 20, True, None), atol=2e-2, rtol=2e-2)


def test_update_cache_and_rollback(kernels):
    """A round writes 6 positions, the target rejects all but the first 2: the next round writes over the
    rest, and attention never reads what is left past its own end (set to huge values here)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401

    torch.manual_seed(1)
    ours, theirs = torch.zeros(2, 1, 32, 2, 16)
    first = torch.randn(1, 6, 2, 16)
    assert kernels.update_cache(first, ours, 10) == 0
    torch.ops.llama.update_cache(first, theirs, 10)
    assert torch.equal(ours, theirs)
    second = torch.randn(1, 3, 2, 16)
    assert kernels.update_cache(second, ours, 12) == 0  # rollback: positions 12..14 again
    torch.ops.llama.update_cache(second, theirs, 12)
    assert torch.equal(ours, theirs) and torch.equal(ours[0, 12:15], second[0]) and torch.equal(ours[0, 15], first[0, 5])
    q = torch.randn(1, 3, 4, 16)
    expected = reference_sdpa(q, ours, ours, 12, True, None)
    ours[0, 15:] = 1e4  # stale: must not be read
    torch.testing.assert_close(kernels.custom_sdpa(q, ours, ours, 12, True, None), expected)
    assert kernels.update_cache(second, ours, 30) != 0  # past the cache's end: refused, nothing written
    assert torch.all(ours[0, 30:] == 1e4)


def gated_delta_inputs(batch, query_heads, heads, tokens, dk, dv, channelwise):
    """Inputs of llama::gated_delta_rule as a Gated DeltaNet layer makes them: unit-norm queries and keys
    (the layer L2-normalizes them), decays (already exponentiated) and betas in (0, 1)."""
    def unit(*shape):
        return torch.nn.functional.normalize(torch.randn(*shape), dim=-1)

    return (unit(batch, query_heads, tokens, dk), unit(batch, heads, tokens, dk), torch.randn(batch, heads, tokens, dv),
            torch.rand(batch, heads, tokens, *([dk] if channelwise else [])),
            torch.sigmoid(torch.randn(batch, heads, tokens)), torch.randn(batch, heads, dk, dv))


@pytest.mark.parametrize("channelwise", [False, True])  # decay [B,H,T] (Qwen3.5) or [B,H,T,Dk]
@pytest.mark.parametrize("tokens", [1, 35])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)])  # (query heads, state heads): grouped, and not
def test_gated_delta_rule_matches_executorch(kernels, channelwise, tokens, heads):
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401

    torch.manual_seed(tokens + heads[0])
    inputs = gated_delta_inputs(2, *heads, tokens, 16, 24, channelwise)
    before = inputs[-1].clone()
    output, final_state = kernels.gated_delta_rule(*inputs)
    expected_output, expected_state = torch.ops.llama.gated_delta_rule(*inputs)
    torch.testing.assert_close(output, expected_output, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final_state, expected_state, atol=1e-4, rtol=1e-4)
    assert torch.equal(inputs[-1], before)  # initial_state is an input: left as it is


def test_gated_delta_rule_refuses_bad_inputs(kernels):
    inputs = gated_delta_inputs(1, 4, 2, 3, 8, 8, channelwise=False)
    for i in range(len(inputs)):  # any input not float32
        bad = list(inputs)
        bad[i] = bad[i].to(torch.bfloat16)
        with pytest.raises(RuntimeError, match="gated_delta_rule failed with error 0x12"):  # InvalidArgument
            kernels.gated_delta_rule(*bad)
    with pytest.raises(RuntimeError, match="gated_delta_rule failed with error 0x12"):  # 3 query heads on 2 state heads
        kernels.gated_delta_rule(*gated_delta_inputs(1, 3, 2, 3, 8, 8, channelwise=False))


# ----------------------------------------------------------------------------------------- the loop


@pytest.mark.parametrize("kind", ["programs", "quantized_shared_programs", "gemma_programs", "hybrid_programs"])
def test_a_verifys_rows_are_one_token_calls_bit_for_bit_in_the_python_runtime(kind, request):
    """The Python runtime runs the runner's kernels (keyed over ExecuTorch's own, native.use_runner_kernels), whose
    rows do not depend on how many a call has: a 9-token call's logits are those of nine one-token calls at the same
    positions, bit for bit, in fp32 and 8da4w (where the last bits of a row become other tokens through 8-bit
    activations: ExecuTorch's custom_sdpa differs there by up to 3e-2 on these programs), with a sliding-window
    ring (Gemma 4) and Gated DeltaNet layers (Qwen3.5). Greedy DFlash's exactness rests on it."""
    programs = request.getfixturevalue(kind)
    target, _ = load_programs(programs if isinstance(programs, Path) else programs[0])
    ids = torch.randint(3, 500, (1, 40), generator=torch.Generator().manual_seed(0))

    def logits(calls: list[range]) -> torch.Tensor:
        target(ids[:, :16], torch.arange(16))  # the same prefill before each: the state of a hybrid's layers too
        return torch.cat([target(ids[:, c.start:c.stop], torch.arange(c.start, c.stop))[0].clone() for c in calls], 1)

    one_call = logits([range(16, 25)])
    assert torch.equal(one_call, logits([range(i, i + 1) for i in range(16, 25)]))
    assert torch.equal(one_call, logits([range(16, 19), range(19, 25)]))


@pytest.fixture(scope="module")
def prompts(programs):
    tok = tokenizer(programs)
    return [encode_chat(tok, r["prompt"]) for r in builtin_prompts(6)]


@pytest.mark.parametrize("kind", ["programs", "shared_programs", "quantized_shared_programs", "single_programs",
                                  "windowed_programs", "trained_dflash2_programs", "reduced_vocab_programs"])
def test_runner_emits_the_python_engines_tokens_and_rounds(kind, request, runner, prompts):
    """fp32 and 8da4w, with and without shared.ptd, two files or one (export.layout single), a draft with a
    context window, a DFlash2 draft (its proposals walked through its lattice): plain and DFlash at several
    blocks, the same tokens and the same rounds (accepted proposals) as the Python engine, and DFlash's tokens plain
    decoding's."""
    programs = request.getfixturevalue(kind)
    python = Engine(programs)
    blocks = (0, 2, 5, python.max_block_size)  # 0: plain decoding

    def runs(engine) -> list:  # one engine at a time: two thread pools taking turns on 2 cores crawl
        return [engine.dflash(ids, 24, block) if block else engine.ar(ids, 24) for ids in prompts[:4] for block in blocks]

    theirs = runs(python)
    with CppEngine(programs, runner, threads=1) as cpp:
        assert (cpp.max_context_len, cpp.max_block_size) == (python.max_context_len, python.max_block_size)
        ours = runs(cpp)
        assert cpp.peak_rss_kb > 0
    plain = [g.tokens for g in theirs[::len(blocks)] for _ in blocks]
    assert [g.tokens for g in theirs] == plain  # lossless at 8da4w too: both runners' kernels are row-exact
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens
        assert [(r.verified, r.accepted) for r in a.rounds] == [(r.verified, r.accepted) for r in b.rounds]
        assert all(r.draft_s > 0 and r.verify_s > 0 and r.host_s >= 0 for r in a.rounds if r.verified)
    assert sum(r.accepted for g in ours for r in g.rounds) > 50  # a trained draft: rollback and the taps are exercised


def test_runner_makes_the_python_engines_lookup_rounds(programs, runner, prompts, tmp_path):
    """Lookup proposals (runner/host/lookup.h, no draft call) at several blocks and at auto: the same tokens and rounds
    (proposed, verified, accepted) in both runners, and plain decoding's tokens, after the test prompts and after
    each followed by its reply and its last tokens again (so that the reply repeats and lookup pays). auto plans on
    one curve in both, where each token verified costs 0.3 of a call: it verifies fewer than proposed at times."""
    python = Engine(programs)
    cases = []
    for ids in prompts[:3]:
        cases += [ids, ids + python.ar(ids, 24).tokens + ids[-6:]][:1 + (len(ids) + 60 <= MAX_SEQ_LEN)]
    curve, most = python.cost_curve(repeats=1), python.max_block_size
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(replace(curve, target_ms=[[1 + 0.3 * t for t in range(most)]] * len(curve.positions))
                               .to_dict()))
    python = Engine(programs, path)
    blocks = (2, 5, most, "auto")
    theirs = [python.lookup(ids, 24, block) for ids in cases for block in blocks]
    with CppEngine(programs, runner, threads=1, cost_curve=path) as cpp:
        ours = [cpp.lookup(ids, 24, block) for ids in cases for block in blocks]
        plain = [cpp.ar(ids, 24).tokens for ids in cases for _ in blocks]
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens
        assert [(r.drafted, r.verified, r.accepted) for r in a.rounds] == [(r.drafted, r.verified, r.accepted)
                                                                           for r in b.rounds]
    assert [g.tokens for g in ours] == plain
    assert len(cases) > 3 and sum(r.accepted for g in ours for r in g.rounds) > 0
    assert any(r.verified < r.drafted for g in ours[3::4] for r in g.rounds)  # auto's


def test_runner_edges_of_the_cache_budget_and_eos(programs, runner, prompts):
    python = Engine(programs)
    long_prompt = (prompts[0] * 8)[:MAX_SEQ_LEN - 3]  # 3 positions left in the cache
    cases = ((long_prompt, 50), (prompts[1], 3), (prompts[2], 200))  # the cache's end, the budget, EOS
    theirs = [(python.dflash(ids, n, python.max_block_size).tokens, python.ar(ids, n).tokens) for ids, n in cases]
    with CppEngine(programs, runner, threads=1) as cpp:
        assert [(cpp.dflash(ids, n).tokens, cpp.ar(ids, n).tokens) for ids, n in cases] == theirs
        assert cpp.dflash(prompts[2], 200).tokens[-1] in python.eos_ids
        with pytest.raises(UserError, match=f"the prompt has {MAX_SEQ_LEN + 2} tokens but max_seq_len is {MAX_SEQ_LEN}"):
            cpp.dflash((prompts[0] * 10)[:MAX_SEQ_LEN + 2], 8)
        with pytest.raises(UserError, match=f"block size 40 is outside 2..{python.max_block_size}"):
            cpp.dflash(prompts[0], 8, 40)
        with pytest.raises(UserError, match="prompt_segments must be a non-empty list"):
            cpp._request({"prompt_segments": [], "max_new_tokens": 4}, None)
        with pytest.raises(UserError, match="this worker reads ids"):
            cpp._request({"prompt": "Hello", "max_new_tokens": 4}, None)
        with pytest.raises(UserError, match="mode must be ar, dflash or lookup, got 'beam'"):
            cpp._request({"prompt_segments": [{"ids": [1, 2]}], "max_new_tokens": 4, "mode": "beam"}, None)
        with pytest.raises(UserError, match="temperature must be 0 .greedy. or a positive number, got -1"):
            cpp._request({"prompt_segments": [{"ids": [1, 2]}], "max_new_tokens": 4, "temperature": -1}, None)
        with pytest.raises(UserError, match=r"stop strings need text; this worker reads ids \(--ids\)"):
            cpp._request({"prompt_segments": [{"ids": [1, 2]}], "max_new_tokens": 4, "stop": ["."]}, None)
        with pytest.raises(UserError, match=r"unknown op 'open'; this worker \(--ids\) answers cost_curve"):
            cpp._request({"op": "open", "session_id": "s"}, None)
        assert cpp.ar(prompts[0], 4).tokens == python.ar(prompts[0], 4).tokens  # still serving after bad requests
        unbounded = {"prompt_segments": [{"ids": long_prompt}], "mode": "ar"}  # no max_new_tokens: to the cache's end
        assert cpp._request(unbounded, None).tokens == python.ar(long_prompt, 50).tokens


def test_the_cpp_runner_streams_each_round_as_it_is_accepted(programs, runner, prompts):
    """CppEngine speaks the worker protocol (--worker --ids): each round's tokens reach `on_tokens` as the runner
    accepts them, in order and together the generation's tokens, the first while the rest are still decoding. A
    runner that held its output back delivers every chunk at once on every try; a streaming one spreads them over the
    decoding unless this process gets no CPU for all of it (the test programs decode 32 tokens in 2 ms: CI under
    load once read them 28 us apart), so a generation may be tried again."""
    with CppEngine(programs, runner, threads=1) as cpp:
        for decode in (cpp.ar, cpp.dflash):
            spans = []
            for _ in range(5):
                chunks = []
                g = decode(prompts[1], 32, on_tokens=lambda new: chunks.append((time.perf_counter(), list(new))))
                assert [t for _, chunk in chunks for t in chunk] == g.tokens
                assert len(chunks) >= len(g.rounds) > 4
                spans.append((chunks[-1][0] - chunks[0][0], sum(r.total_s for r in g.rounds[1:])))
                if spans[-1][0] >= 0.5 * spans[-1][1]:
                    break
            else:
                pytest.fail(f"{decode.__name__}: every try's chunks came together (s apart, s decoding): {spans}")


def test_cli_runner_cpp(programs, runner, capsys):
    argv = ["generate", "--programs", str(programs), "--prompt", "Write a haiku about the sea.", "--json",
            "--max-new-tokens", "20"]
    cli.main(argv + ["--runner", "cpp"])
    cli.main(argv + ["--block-size", "6"])
    cli.main(argv + ["--runner", "cpp", "--block-size", "6"])
    cli.main(argv + ["--runner", "cpp", "--temperature", "0.8", "--seed", "3", "--num-samples", "2"])
    cli.main(argv + ["--runner", "cpp", "--temperature", "0.8", "--seed", "3"])
    cpp, python, cpp6, sampled, other, again = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert cpp["tokens"] == python["tokens"] == cpp6["tokens"] and cpp["text"] == python["text"]
    assert sampled["tokens"] == again["tokens"] != other["tokens"] and (sampled["seed"], other["seed"]) == (3, 4)
    with pytest.raises(SystemExit, match=r"error: .*target\.pte is not a cost curve \(parse error at line 1"):
        cli.main(argv + ["--runner", "cpp", "--cost-curve", str(programs / "target.pte")])


# ------------------------------------------------------------------------------------------ auto's planner

PLAN_VOCAB = 64


def scripted_curve() -> CostCurve:
    """A cost curve that bends (target calls dearer past 6 tokens, and with the position), with a confidence
    read dear enough that choosing k does not always pay for it."""
    rows = [[1.0 + 0.05 * t + 0.3 * max(0, t - 6) + 0.001 * p for t in range(16)] for p in (0, 300, 700)]
    drafts = [[0.4 + 0.03 * b + 0.0005 * p for b in range(15)] for p in (0, 300, 700)]
    return CostCurve([40, 300, 700], rows, drafts, programs="scripted", confidence_ms=0.35)


def draft_logits(rng: random.Random, rows: int, sure: bool) -> torch.Tensor:
    """Rows whose top token has a confidence 0.03 or more from any bin edge of `Calibration` (tenths), so that
    float32 softmaxes summed in another order bin them alike; `sure`: 0.4 or more."""
    out = torch.zeros(rows, PLAN_VOCAB)
    for i in range(rows):
        c = (rng.randrange(4 * sure, 10) + 0.5) / 10 + rng.uniform(-0.02, 0.02)
        out[i, rng.randrange(PLAN_VOCAB)] = math.log(c * (PLAN_VOCAB - 1) / (1 - c))
    return out


def test_runner_auto_is_lossless_and_keeps_its_cost_curve(programs, runner, prompts, tmp_path):
    """Greedy auto emits plain decoding's tokens; the curve it measures is of these programs (Engine.identity),
    and a file of it is taken back exactly, one of other programs refused in one line; on a curve where each
    proposal verified costs something, it verifies fewer than it drafted where the draft is unsure."""
    python = Engine(programs)
    theirs = [python.ar(ids, 40).tokens for ids in prompts]
    with CppEngine(programs, runner, threads=1) as cpp:
        curve = cpp.cost_curve(repeats=1)
        assert curve.programs == python.identity and curve.max_block == cpp.max_block_size
        ours = [cpp.dflash(ids, 40, "auto") for ids in prompts]
        sampled = [cpp.dflash(prompts[0], 12, block, sampler=Sampler(Sampling(0.8, seed=1)))
                   for block in ("auto", cpp.max_block_size)]
    assert [g.tokens for g in ours] == theirs
    assert sampled[0].tokens == sampled[1].tokens  # sampled, auto keeps the largest block
    assert [(r.drafted, r.verified) for r in sampled[0].rounds] == [(r.drafted, r.verified) for r in sampled[1].rounds]
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(curve.to_dict()))
    with CppEngine(programs, runner, threads=1, cost_curve=path) as cpp:
        assert cpp.cost_curve() == curve
        assert cpp.dflash(prompts[1], 40, "auto").tokens == theirs[1]
    # each proposal verified costs 0.3 of a plain step: auto verifies fewer than it drafted when unsure (on a
    # measured curve verifying them all can be right, as on a CPU where a call of 8 costs what one of 1 does)
    step, b = curve.target(1, curve.positions[0]), curve.max_block
    path.write_text(json.dumps(replace(curve, target_ms=[[step * (1 + 0.3 * t) for t in range(b)]] * 3,
                                       draft_ms=[[0.3 * step] * (b - 1)] * 3, positions=[0, 500, 1000],
                                       confidence_ms=0.0).to_dict()))
    with CppEngine(programs, runner, threads=1, cost_curve=path) as cpp:
        graded = [cpp.dflash(ids, 40, "auto") for ids in prompts]
    assert [g.tokens for g in graded] == theirs
    assert sum(r.verified < r.drafted for g in graded for r in g.rounds) >= 3, [g.rounds for g in graded]
    path.write_text(json.dumps(replace(curve, programs="0:0").to_dict()))
    with pytest.raises(ProgramError, match=rf"^{path} was measured on other programs than these; rerun the bench"):
        CppEngine(programs, runner, cost_curve=path)


@pytest.mark.parametrize("kind", ["programs", "trained_dflash2_programs", "reduced_vocab_programs"])
def test_runner_samples_the_targets_distribution(kind, request, runner, prompts):
    """Sampled plain decoding and sampled DFlash (both proposal modes; a DFlash2 draft's walk greedy or drawn; a
    reduced head's proposals read at its ids, q zero outside them) through the runner against plain sampling by the Python engine: per generated position, the chi-square test
    of validate's sampling check (Bonferroni over the positions and modes). The two generators differ, so only
    distributions can agree."""
    from dflash_et.evaluate.same_distribution import chi_square

    programs = request.getfixturevalue(kind)
    samples, tokens, alpha = 400, 6, 1e-3
    settings = Sampling(temperature=1.5, top_p=0.95, top_k=20)
    python = Engine(programs)
    ids = prompts[2]

    def completions(run) -> list[Counter]:
        outs = [run(i).tokens for i in range(samples)]
        return [Counter(o[p] if p < len(o) else -1 for o in outs) for p in range(tokens)]

    def sampler(seed: int, proposals: str = "argmax") -> Sampler:
        return Sampler(replace(settings, seed=seed, proposals=proposals))

    reference = completions(lambda i: python.ar(ids, tokens, sampler=sampler(10_000 + i)))
    with CppEngine(programs, runner, threads=1) as cpp:
        runs = {"ar": completions(lambda i: cpp.ar(ids, tokens, sampler=sampler(i)))}
        for proposals in ("argmax", "sample"):
            runs[proposals] = completions(lambda i: cpp.dflash(ids, tokens, 8, sampler=sampler(i, proposals)))
        assert cpp.dflash(ids, 12, 8, sampler=sampler(5)).tokens == cpp.dflash(ids, 12, 8, sampler=sampler(5)).tokens
    p_values = {(mode, p): chi_square(counts[p], reference[p])[2] for mode, counts in runs.items() for p in range(tokens)}
    assert min(p_values.values()) > alpha / len(p_values), p_values
    assert all(len(counts[p]) > 1 for counts in runs.values() for p in range(tokens))  # sampled at every position


# ------------------------------------------------------------------------------------------ DFlash2 drafts


def test_the_runners_walk_through_a_lattice():
    """Greedy, each position's choice is the best score after the choice before it (checked position by position
    against the scores it reports), and the pairwise scores decide paths (left out, most change); argmax proposals
    at temperature > 0 walk the same path (q one-hot: none). Sampled, paths follow the exact law of a sampled walk
    (test_dflash2's enumeration; chi-square), and each q row is its position's distribution after the candidate
    drawn before it."""
    from dflash_et.evaluate.same_distribution import chi_square
    from dflash_et.runtime.native import walk
    from tests.test_dflash2 import toy_lattice
    from tests.test_sampling import V, toy_target

    g, moved = torch.Generator().manual_seed(0), 0
    for _ in range(40):
        candidates, unary, pair = (torch.randint(0, 100, (7, 6), generator=g), torch.randn(7, 6, generator=g),
                                   torch.randn(7, 6, 6, generator=g))
        path, q, scores = walk(candidates, unary, pair, 100)
        chosen = 0
        for p in range(7):
            torch.testing.assert_close(scores[p], unary[p] + pair[p, chosen])
            chosen = int(scores[p].argmax())
            assert path[p] == candidates[p, chosen] and q is None
        assert walk(candidates, unary, pair, 100, temperature=0.7)[:2] == (path, None)
        moved += walk(candidates, unary, torch.zeros_like(pair), 100)[0] != path
    assert moved > 20, moved
    lattice, law = toy_lattice(3, toy_target(3), 0.9)
    seen = Counter()
    for seed in range(20000):
        path, q, _ = walk(lattice.candidates, lattice.unary, lattice.pair, V, temperature=0.9, sample=True, seed=seed)
        if tuple(path) not in seen:
            torch.testing.assert_close(q, law[tuple(path)][1], rtol=0, atol=1e-6)
        seen[tuple(path)] += 1
    expected = Counter({path: round(p * 1e6) for path, (p, _) in law.items()})
    assert chi_square(seen, expected)[2] > 1e-3


def test_greedy_dflash2_through_the_runner_is_plain_greedy_decoding(trained_dflash2_programs, runner, prompts, monkeypatch):
    """Token for token at blocks 2, 5, the largest and auto (its planner reading the walked path's scores); and the
    walk decides the rounds: the same draft with its pairwise scores left out (each position's top logit, through
    the Python engine) makes other ones."""
    python = Engine(trained_dflash2_programs)
    blocks = (2, 5, python.max_block_size)
    with CppEngine(trained_dflash2_programs, runner, threads=1) as cpp:
        ours = {(i, b): cpp.dflash(ids, 24, b) for i, ids in enumerate(prompts[:4]) for b in blocks}
        cpp.cost_curve(repeats=1)
        auto = [cpp.dflash(ids, 24, "auto") for ids in prompts[:4]]
    plain = [python.ar(ids, 24).tokens for ids in prompts[:4]]
    assert all(g.tokens == plain[i] for (i, _), g in ours.items())
    assert [g.tokens for g in auto] == plain and any(r.verified for g in auto for r in g.rounds)  # it drafted
    assert sum(r.accepted for g in ours.values() for r in g.rounds) > 50

    walked = DFlash2DraftProgram.__call__

    def top_logits(self, *args):  # the draft's lattice without its pairwise scores
        candidates, unary, pair = walked(self, *args)
        return candidates, unary, torch.zeros_like(pair)

    monkeypatch.setattr(DFlash2DraftProgram, "__call__", top_logits)
    blind = {(i, b): python.dflash(prompts[i], 24, b) for i, b in ours}
    assert any([(r.verified, r.accepted) for r in blind[key].rounds] != [(r.verified, r.accepted) for r in g.rounds]
               for key, g in ours.items())


# ---------------------------------------------------------------------------------------------- errors


def run_binary(runner: Path, programs: Path, *args: str) -> subprocess.CompletedProcess:
    """The runner's output as it wrote it: bytes decoded without `text=True`'s newline translation, which would
    turn a reply's "\r" into "\n" (sampled replies have them)."""
    done = subprocess.run([str(runner), "--programs", str(programs), *args], capture_output=True)
    done.stdout, done.stderr = (b.decode("utf-8", "surrogateescape") for b in (done.stdout, done.stderr))
    return done


def assert_one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert message in result.stderr.strip().splitlines()[-1], result.stderr


def test_runner_bad_inputs_are_one_line_errors(runner, programs, shared_programs, mixed_programs, tmp_path):
    prompt = "--prompt-ids", "1,2,3"
    assert_one_line_error(run_binary(runner, tmp_path / "none", *prompt),
                          f"{tmp_path}/none/target.pte is missing: {REBUILD}")
    no_ptd = tmp_path / "no-ptd"
    shutil.copytree(shared_programs, no_ptd)
    (no_ptd / "shared.ptd").unlink()
    assert_one_line_error(run_binary(runner, no_ptd, *prompt), "target.pte cannot be loaded")
    assert_one_line_error(run_binary(runner, no_ptd, *prompt), "shared.ptd must be beside it")
    assert_one_line_error(run_binary(runner, mixed_programs, *prompt), "draft.pte was exported for another target than")
    swapped, lone = tmp_path / "swapped", tmp_path / "lone"  # a draft where the target belongs; a target alone
    for d, source in ((swapped, "draft.pte"), (lone, "target.pte")):
        d.mkdir()
        (d / "target.pte").symlink_to(programs / source)
    assert_one_line_error(run_binary(runner, swapped, *prompt), "target.pte has no target method: it was exported by "
                          "another tool or an older dflash-et; re-export it (dvc repro)")
    assert_one_line_error(run_binary(runner, lone, *prompt), "has no draft.pte, and its target.pte no 'draft' method "
                          f"(export.layout single puts the draft there): {REBUILD}")
    too_long = ",".join(["1"] * (MAX_SEQ_LEN + 1))
    assert_one_line_error(run_binary(runner, programs, "--prompt-ids", too_long), "shorten the prompt")
    assert_one_line_error(run_binary(runner, programs, *prompt, "--block-size", "99"), "block size 99 is outside 2..")
    assert_one_line_error(run_binary(runner, programs, "--prompt-ids", "1,x"), "each prompt id must be an integer")
    assert_one_line_error(run_binary(runner, programs, "--prompt-ids", ""), "the prompt is empty")
    assert_one_line_error(run_binary(runner, programs, "--prompt-ids", "1,999999"),
                          "prompt token 999999 is outside the vocabulary")
    assert_one_line_error(run_binary(runner, programs, *prompt, "--max-new-tokens", "0"),
                          "max_new_tokens must be at least 1, got 0")
    for flag, value, message in (("--temperature", "-1", "temperature must be 0 (greedy) or a positive number"),
                                 ("--top-p", "2", "top_p must be in (0, 1]"), ("--top-k", "-3", "top_k must be"),
                                 ("--proposals", "best", "proposals must be argmax or sample")):
        assert_one_line_error(run_binary(runner, programs, *prompt, flag, value), message)
    bad_weights = tmp_path / "bad-ptd"
    shutil.copytree(shared_programs, bad_weights)
    (bad_weights / "shared.ptd").write_bytes((shared_programs / "shared.ptd").read_bytes()[:1000])
    assert_one_line_error(run_binary(runner, bad_weights, *prompt), "shared.ptd is not a readable weights file")
    for args, message in ((("--bogus",), "unknown argument --bogus"),
                          (("--threads", "-1"), "--threads must be at least 1"),
                          (("--ids",), "--ids is a worker's (--worker --ids)")):
        bad = run_binary(runner, programs, *prompt, *args)
        assert bad.returncode == 2 and message in bad.stderr


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_programs_are_named_in_cpp_and_python(runner, programs, tmp_path, damage):
    broken = tmp_path / "programs"
    shutil.copytree(programs, broken)
    data = (programs / "target.pte").read_bytes()
    (broken / "target.pte").write_bytes(data[:len(data) // 3] if damage == "truncated" else b"\x07" * len(data))
    message = f"{broken}/target.pte is not a readable ExecuTorch program"
    result = run_binary(runner, broken, "--prompt-ids", "1,2,3")
    assert_one_line_error(result, message)
    assert result.stderr.strip().endswith(f"truncated or corrupt; {REBUILD}")  # the Python runner's wording
    with pytest.raises(ProgramError, match=f"{message} .*: truncated or corrupt"):
        load_programs(broken)
    with pytest.raises(ProgramError, match=message):
        CppEngine(broken, runner)
    if damage == "corrupt":
        return
    cmd = subprocess.run([str(Path(sys.executable).parent / "dflash"), "generate", "--prompt", "hi", "--programs",
                          str(broken)], capture_output=True, text=True)
    assert cmd.returncode == 1 and cmd.stderr.strip().splitlines()[-1].startswith(f"error: {message}")


def test_the_runtimes_info_lines_are_not_shown_but_its_errors_are(runner, programs, tmp_path):
    """ExecuTorch's Info lines (its thread pool's five cpuinfo lines, in every process that loads a program) reach
    neither the runner's stderr nor `dflash generate`'s; the runtime's errors still do, beside the command's own."""
    dflash = str(Path(sys.executable).parent / "dflash")
    broken = tmp_path / "broken"
    shutil.copytree(programs, broken)
    (broken / "draft.pte").write_bytes((programs / "draft.pte").read_bytes()[:50_000])
    for folder, lines in ((programs, 1), (broken, 2)):  # the statistics; the runtime's error and the command's
        args = "--prompt", "hi", "--programs", str(folder), "--max-new-tokens", "4"
        for done in (run_binary(runner, folder, *args[:2], *args[4:]),
                     subprocess.run([dflash, "generate", *args], capture_output=True, text=True)):
            assert len(done.stderr.splitlines()) == lines and "cpuinfo" not in done.stderr, done.stderr
            assert done.returncode == (folder == broken)
            assert "[dflash] 4 tokens" in done.stderr if folder == programs else "File size is too small" in done.stderr


def test_bench_with_the_cpp_runner(programs, runner):
    from dflash_et.evaluate.bench import BenchConfig, run_bench

    config = BenchConfig(num_prompts=2, long_prompts=1, max_new_tokens=12, repeats=1, warmup=0, latency_repeats=1,
                         block_sizes=(4, 8), runner="cpp")
    metrics, plots, curve = run_bench(programs, 4, config)
    assert metrics["runner"] == "cpp" and metrics["lossless"] and metrics["tau"] > 1
    assert set(metrics["speedup_by_block"]) == {"4", "8"} and metrics["host_ms_per_round"] > 0
    assert metrics["speedup_auto"] > 0 and curve.programs == Engine(programs).identity  # the runner's curve
    assert len(plots["cost_curve"]) == curve.max_block
    with pytest.raises(ValueError, match="bench.runner must be one of python, cpp, got 'java'"):
        run_bench(programs, 4, BenchConfig(runner="java"))
    with pytest.raises(ValueError, match=r"block_size 99 is outside 2\.\.\d+, .*; use block_size auto, or at most"):
        run_bench(programs, 99, BenchConfig(runner="cpp"))


def test_the_runner_is_found_in_the_clone_a_command_runs_in(tmp_path, monkeypatch):
    """A second clone with the package installed from the first finds its own build (`make runner` there);
    $DFLASH_RUNNER wins, an installed one on PATH comes last, and none is one line."""
    from dflash_et.runtime import cpp_runner

    clone, elsewhere, bin_dir = tmp_path / "clone", tmp_path / "elsewhere", tmp_path / "bin"
    for d in (clone / "runner" / "build", elsewhere, bin_dir):
        d.mkdir(parents=True)
    (clone / cpp_runner.BINARY).write_text("")
    monkeypatch.delenv("DFLASH_RUNNER", raising=False)
    monkeypatch.setattr(cpp_runner, "PACKAGE_CLONE", elsewhere)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.chdir(clone)
    assert cpp_runner.find_runner() == clone / cpp_runner.BINARY
    monkeypatch.setenv("DFLASH_RUNNER", str(tmp_path / "mine"))
    assert cpp_runner.find_runner() == tmp_path / "mine"
    monkeypatch.delenv("DFLASH_RUNNER")
    monkeypatch.chdir(elsewhere)
    with pytest.raises(UserError, match=r"^the C\+\+ runner is not built \(no runner/build/dflash_runner here or in "
                                        rf"{elsewhere}, none on PATH, DFLASH_RUNNER unset\); run `make runner`$"):
        cpp_runner.find_runner()
    installed = bin_dir / "dflash_runner"
    installed.write_text("")
    installed.chmod(0o755)
    assert cpp_runner.find_runner() == installed


def test_one_seam_opens_either_decoder(programs, runner):
    from dflash_et.runtime.decoder import Decoder, open_decoder

    members = [m for m in dir(Decoder) if not m.startswith("_") or m in ("__enter__", "__exit__")]
    for name in ("python", "cpp"):
        with open_decoder(programs, name) as decoder:
            assert all(hasattr(decoder, m) for m in members + list(Decoder.__annotations__))
            assert isinstance(decoder, CppEngine) == (name == "cpp")
    with pytest.raises(UserError, match="^the runner must be one of python, cpp, got 'rust'$"):
        open_decoder(programs, "rust")


def test_building_and_finding_the_runner_fail_in_one_line(programs, tmp_path, monkeypatch):
    """What `make runner` and `--runner cpp` say when the runner cannot be built or was not."""
    from runner import toolchain

    with pytest.raises(UserError, match=r"the C\+\+ runner is not built .*; run `make runner`"):
        CppEngine(programs, tmp_path / "dflash_runner")
    monkeypatch.setattr(toolchain, "SOURCES", tmp_path / "nowhere")
    with pytest.raises(UserError, match="the runner's sources are not in .*nowhere; build it from a clone"):
        toolchain.build_runner(tmp_path / "build")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.19)\nproject(broken CXX)\nthis_is_not_cmake()\n")
    monkeypatch.setattr(toolchain, "SOURCES", broken)
    with pytest.raises(UserError, match=r"building the C\+\+ runner failed \(`cmake -S`\); its output is in .*build.log"):
        toolchain.build_runner(tmp_path / "build")
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="cmake is not installed; the C.. runner needs cmake >= 3.19"):
        toolchain.build_runner(tmp_path / "build")
