"""export.layout single: one target.pte holding `forward`, `target` and `draft`, as upstream's DFlash example
lays a program out. It stores what the methods share once, keeps the draft's state apart from the target's,
decodes exactly as the pair layout does, and upstream's own driver runs it."""

import io
import json
import runpy
import sys
from contextlib import redirect_stdout

import pytest

from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.export.config import ExportConfig
from dflash_et.errors import ExportError, ProgramError
from dflash_et.metadata import DRAFT_METHOD, STOCK_METHOD, TARGET_METHOD
from dflash_et.evaluate.bench import BenchConfig, run_bench
from dflash_et.evaluate.validate import validate
from dflash_et.runtime.engine import Engine
from dflash_et.runtime.programs import load_programs
from tests.tiny_checkpoints import checkpoint_facts
from tests.tiny_programs import planned_arenas, validate_config

PROMPTS = ["What is 12 times 7?", "Write a Python function that reverses a list.", "Tell me about the sea."]


def test_one_file_stores_the_borrowed_weights_once(programs, single_programs, trained_pair):
    assert not (single_programs / "draft.pte").exists()
    target, draft = load_programs(single_programs)
    assert draft.path == target.path and draft.program is target.program
    assert {STOCK_METHOD, TARGET_METHOD, DRAFT_METHOD, "get_max_ctx_len", "get_prefill_chunk_size",
            "get_max_block_len", "get_mask_token_id"} <= target.program.method_names
    facts = checkpoint_facts(trained_pair)
    borrowed = 2 * 4 * facts["vocab_size"] * facts["hidden_size"]  # the fp32 embedding and head (untied)
    pair_bytes = (programs / "target.pte").stat().st_size + (programs / "draft.pte").stat().st_size
    single_bytes = (single_programs / "target.pte").stat().st_size
    assert single_bytes <= pair_bytes - 0.95 * borrowed, (single_bytes, pair_bytes, borrowed)


def test_the_drafts_state_is_its_own(programs, single_programs):
    """Methods of one program share every mutable buffer of the same name: the draft's KV caches, named as the
    target's are, must not be the target's. All three methods point at one state arena as large as both
    programs' of the pair together."""
    single, pair = planned_arenas(single_programs / "target.pte"), {**planned_arenas(programs / "target.pte"),
                                                               **planned_arenas(programs / "draft.pte")}
    assert {len(a) for a in single.values()} == {3}
    assert single[TARGET_METHOD][2] == single[STOCK_METHOD][2] == single[DRAFT_METHOD][2]
    assert single[TARGET_METHOD][2] == pair[TARGET_METHOD][2] + pair[DRAFT_METHOD][2]


def test_both_layouts_decode_the_same_tokens_losslessly(programs, single_programs, trained_pair):
    tok = tokenizer(trained_pair[0])
    pair, single = Engine(programs), Engine(single_programs)
    accepted = 0
    for text in PROMPTS:
        prompt = encode_chat(tok, text)
        plain = pair.ar(prompt, 40).tokens
        assert single.ar(prompt, 40).tokens == plain
        for block in (4, 8):
            out = single.dflash(prompt, 40, block)
            assert out.tokens == plain
            accepted += sum(r.accepted for r in out.rounds)
    assert accepted > 3 * len(PROMPTS)  # a trained draft: rounds accept proposals, so verify and rollback ran


def test_upstreams_driver_runs_the_single_layout(single_programs, trained_pair):
    """ExecuTorch's DFlash example driver (backends/mlx/examples/llm/dflash/run.py, greedy), given our
    target.pte and tokenizer, emits the tokens our engine does on the same prompt."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (the program's llama:: kernels)

    from dflash_et.models.mlx_ops import ensure_mlx_backend

    ensure_mlx_backend()  # the example's package imports the MLX backend, whose files a venv generates on first use
    from executorch.backends.mlx.examples.llm.runtime_meta import apply_chat_template, load_text_processor

    tok = load_text_processor(str(single_programs), local_files_only=True)
    prompt = apply_chat_template(tok, PROMPTS[0], enable_thinking=False)[0].tolist()
    ours = Engine(single_programs).dflash(prompt, 24, 8).tokens
    argv = ["run", "--pte", str(single_programs / "target.pte"), "--tokenizer", str(single_programs),
            "--prompt", PROMPTS[0], "--max-new-tokens", "24", "--verbose"]
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(out):
        mp.setattr(sys, "argv", argv)
        runpy.run_module("executorch.backends.mlx.examples.llm.dflash.run", run_name="__main__")
    ids = [line for line in out.getvalue().splitlines() if line.startswith("TOKEN_IDS: ")]
    assert json.loads(ids[0].removeprefix("TOKEN_IDS: ")) == ours


def test_validate_and_bench_run_on_the_single_layout(single_programs, trained_pair):
    report = validate(single_programs, *trained_pair, validate_config(prompts=1, max_new_tokens=12))
    assert report["failures"] == [] and report["lossless"] is True
    metrics, _, _ = run_bench(single_programs, 4, BenchConfig(num_prompts=2, max_new_tokens=8, latency_repeats=1,
                                                              block_sizes=(2,)))
    assert metrics["lossless"] is True and metrics["tau"] > 1


def test_single_layout_refuses_shared_weights_and_a_missing_draft(programs, tmp_path):
    with pytest.raises(ExportError, match=r"single layout's one program stores them once by itself: set "
                                          r"export.shared_weights=false"):
        ExportConfig(layout="single", shared_weights=True).check()
    with pytest.raises(ExportError, match=r"export.layout='one' does not exist; use one of pair, single"):
        ExportConfig(layout="one").check()
    (tmp_path / "target.pte").symlink_to(programs / "target.pte")
    with pytest.raises(ProgramError, match=r"has no draft.pte, and its target.pte no 'draft' method \(export.layout "
                                           r"single puts the draft there\)"):
        load_programs(tmp_path)
