"""model.draft: none (#59): a target without a draft exports target.pte alone, and every runner decodes it with lookup
proposals, exactly as plain decoding."""

import json

import openai
import pytest

from dflash_et.checkpoints.fetch import fetch
from dflash_et.checkpoints.load import NO_DRAFT, has_draft, target_alone_layers
from dflash_et.checkpoints.pair import load_pair
from dflash_et.checkpoints.zlab import BLOCK_SIZE
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts
from dflash_et.errors import CheckpointError, ProgramError
from dflash_et.evaluate.bench import BenchConfig, run_bench
from dflash_et.evaluate.validate import validate
from dflash_et.export.config import ExportConfig
from dflash_et.export.lower import methods
from dflash_et.metadata import DRAFT_METHOD, STOCK_METHOD, TARGET_METHOD
from dflash_et.runtime.cpp_runner import CppEngine
from dflash_et.runtime.engine import Engine
from dflash_et.runtime.programs import load_programs
from tests.test_serve import MODEL, plain_text, served
from tests.tiny_programs import MAX_SEQ_LEN, validate_config


def test_model_draft_none_fetches_a_marker_and_an_unknown_source_names_it(pair, tmp_path):
    fetch("draft", "none", tmp_path / "none", target_dir=pair[0])
    assert [p.name for p in (tmp_path / "none").iterdir()] == ["config.json"]
    assert json.loads((tmp_path / "none" / "config.json").read_text()) == NO_DRAFT
    assert not has_draft(tmp_path / "none") and has_draft(pair[1])
    with pytest.raises(CheckpointError, match="'auto', 'train', 'none'"):
        fetch("draft", "nothing", tmp_path / "bad", target_dir=pair[0])
    assert not (tmp_path / "bad").exists()


def test_without_a_draft_the_single_layout_holds_the_targets_methods_alone(pair, tmp_path):
    fetch("draft", "none", tmp_path / "none", target_dir=pair[0])
    target, draft, settings = load_pair(pair[0], tmp_path / "none", max_seq_len=64)
    assert draft is None and settings is None and target.layer_ids == target_alone_layers(pair[0])
    assert set(methods("single", target, None, ExportConfig())) == {TARGET_METHOD, STOCK_METHOD}


def test_the_target_exports_alone_saying_its_block(target_alone_programs, trained_pair):
    programs, _ = target_alone_programs
    assert [p.name for p in programs.glob("*.pte")] == ["target.pte"]
    assert list(json.loads((programs / "export.json").read_text())["programs"]) == ["target"]
    assert json.loads((programs.parent / "build" / "draft" / "export.json").read_text())["program"] is None
    target, draft = load_programs(programs)
    assert draft is None and DRAFT_METHOD not in target.program.method_names
    assert target.meta.max_block_len == BLOCK_SIZE
    assert list(target.meta.target_layer_ids) == target_alone_layers(trained_pair[0])


def repeating(engine: Engine, programs) -> list[list[int]]:
    """The test prompts, and each followed by its reply and its last tokens again (the reply repeats: lookup pays)."""
    out = []
    for row in builtin_prompts(3):
        ids = encode_chat(tokenizer(programs), row["prompt"])
        out += [ids, ids + engine.ar(ids, 24).tokens + ids[-6:]][:1 + (len(ids) + 60 <= MAX_SEQ_LEN)]
    return out


def test_both_runners_decode_with_lookup_alone_as_plain_decoding(target_alone_programs, runner, tmp_path):
    """At fixed blocks and at auto (planned on one cost curve, measured without a draft: target calls of every
    size), `dflash` is lookup's decoding: the same tokens and rounds in both runners, and plain decoding's tokens."""
    programs, _ = target_alone_programs
    python = Engine(programs)
    curve = python.cost_curve(repeats=1)
    assert len(curve.target_ms[0]) == BLOCK_SIZE and all(ms > 0 for row in curve.target_ms for ms in row)
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(curve.to_dict()))
    python = Engine(programs, path)
    cases, blocks = repeating(python, programs), (2, 5, BLOCK_SIZE, "auto")
    theirs = [python.dflash(ids, 24, block) for ids in cases for block in blocks]
    plain = [python.ar(ids, 24).tokens for ids in cases for _ in blocks]
    with CppEngine(programs, runner, threads=1, cost_curve=path) as cpp:
        assert (cpp.max_context_len, cpp.max_block_size) == (python.max_context_len, BLOCK_SIZE)
        ours = [cpp.dflash(ids, 24, block) for ids in cases for block in blocks]
    with CppEngine(programs, runner, threads=1) as measuring:  # its own sweep, without a draft
        assert all(ms > 0 for row in measuring.cost_curve(repeats=1).target_ms for ms in row)
    for a, b, tokens in zip(ours, theirs, plain):
        assert a.tokens == b.tokens == tokens
        assert [(r.drafted, r.verified, r.accepted) for r in a.rounds] == [(r.drafted, r.verified, r.accepted)
                                                                           for r in b.rounds]
        assert all(r.looked_up and r.draft_s == 0 for r in a.rounds + b.rounds if r.verified)
    assert len(cases) > 3 and sum(r.accepted for g in ours for r in g.rounds) > 0


def test_validate_checks_programs_without_a_draft(target_alone_programs, trained_pair):
    """Numerics, greedy lossless at blocks 2, 16 and auto, and the sampled distribution, with lookup proposals; a
    draft given for programs exported without one (or none for a pair's) is refused in one line."""
    programs, none = target_alone_programs
    report = validate(programs, trained_pair[0], none, validate_config())
    assert report["failures"] == [] and report["lossless"] and report["draft"] is None
    assert report["target_rel_err"] < 1e-4 and set(report["tau_by_block"]) == {"2", str(BLOCK_SIZE), "auto"}
    assert report["sampling"]["tests"] > 0 and report["sampling"]["same_distribution"]
    with pytest.raises(ProgramError, match="exported without a draft"):
        validate(programs, trained_pair[0], trained_pair[1], validate_config())


def test_the_bench_measures_lookup_without_a_draft(target_alone_programs):
    programs, _ = target_alone_programs
    metrics, _, curve = run_bench(programs, "auto", BenchConfig(num_prompts=3, long_prompts=1, max_new_tokens=16,
                                                                block_sizes=(4,), latency_repeats=1))
    assert metrics["lossless"] and curve.max_block == BLOCK_SIZE
    assert "draft" not in metrics["auto_sources"] and set(metrics["auto_sources"]) <= {"lookup", "plain"}
    assert sum(s["share"] for s in metrics["auto_sources"].values()) == pytest.approx(1)  # a round is one source's


def test_serve_answers_with_lookup_without_a_draft(target_alone_programs, runner, tmp_path):
    """`dflash serve` on target.pte alone: each reply is plain greedy decoding's, streamed and not."""
    programs, _ = target_alone_programs
    with served(programs, runner, tmp_path / "server.log") as (url, _):
        client = openai.OpenAI(base_url=url, api_key="none")
        for row in builtin_prompts(2):
            messages = [{"role": "user", "content": row["prompt"]}]
            whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True) if c.choices)
            assert whole.choices[0].message.content == streamed == plain_text(programs, messages, 24)
