"""Programs for the other backends, dtypes, quantizations and layer variants: they lower, run where this host
can, and agree with the eager models; bad export settings are refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from dflash_et.checkpoints.pair import load_pair
from dflash_et.errors import ExportError, ProgramError
from dflash_et.export.config import PROGRAM_KINDS, ExportConfig
from dflash_et.export.lower import export_program
from dflash_et.export.package import package
from dflash_et.export.recipes import quantize
from dflash_et.evaluate.validate import validate
from dflash_et.runtime.programs import DraftProgram, TargetProgram, load_programs, missing_backend
from tests.tiny_checkpoints import checkpoint_facts
from tests.tiny_programs import MAX_SEQ_LEN, PREFILL_CHUNK, build_programs, built_once, numerics, validate_config


def test_portable_target_runs_without_delegates(trained_pair, tmp_path):
    pair = trained_pair
    export_program("target", *pair, ExportConfig(backend="portable", max_seq_len=64), tmp_path)
    summary = json.loads((tmp_path / "export.json").read_text())
    assert summary["ops"]["delegated"] == 0 and summary["ops"]["portable"] > 0
    program = TargetProgram(tmp_path / "target.pte")
    target, _, _ = load_pair(*pair, max_seq_len=64)
    tokens = torch.arange(5)[None]
    with torch.no_grad():
        ref_logits, ref_taps = target(tokens, torch.arange(5))
    logits, taps = program(tokens, torch.arange(5))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(taps, ref_taps, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("params, message", [
    ({"backend": "coreml"}, "export.backend='coreml' does not exist; use one of xnnpack, portable, mlx"),
    ({"quantize": "4w"}, "export.quantize=4w needs the mlx backend .*; set export.backend=mlx, or for xnnpack "
                         "export.quantize=none \\| 8da4w \\| 8da8w$"),
    ({"quantize": "int8_weight_only"}, "weight-only configs lower to XNNPACK but compute wrong outputs; with mlx use 4w"),
    ({"quantize": "8da4w", "backend": "portable"}, "needs the xnnpack backend .*for portable export.quantize=none$"),
    ({"quantize": "8da8w", "backend": "mlx"}, "needs the xnnpack backend .*for mlx export.quantize=none \\| 4w$"),
    ({"quantize": "4w", "backend": "mlx", "group_size": 16}, "MLX's quantized kernels take groups of 32, 64, 128"),
    ({"backend": "mlx", "shared_weights": True}, "the mlx delegate keeps every weight inside its .pte; set "
                                                 "export.shared_weights=false"),
    ({"dtype": "fp64"}, "export.dtype='fp64' does not exist; use one of fp32, fp16, bf16"),
    ({"dtype": "bf16", "quantize": "8da4w"}, "set export.dtype=fp32"),
    ({"max_seq_len": 2}, "max_seq_len >= 4"),
    ({"sliding_cache": "window"}, "export.sliding_cache='window' does not exist; use one of ring, full"),
    ({"colour": "red"}, "^export.colour is not a setting; the export section takes backend, dtype, quantize, "),
    ({"draft_head": "int4"}, "export.draft_head='int4' does not exist; use one of same, 8da8w"),
    ({"draft_head": "8da8w", "shared_weights": True}, "shared.ptd cannot share it.*export.shared_weights=false"),
    ({"draft_head": "8da8w", "backend": "portable"}, "set export.backend=xnnpack"),
])
def test_bad_export_settings(params, message):
    with pytest.raises(ExportError, match=message):
        ExportConfig.from_params(params)


def test_a_kind_of_program_not_exported_is_refused_before_anything_is_read(tmp_path):
    with pytest.raises(ExportError, match=rf"^'targt' is not a program to export; use one of {', '.join(PROGRAM_KINDS)}$"):
        export_program("targt", tmp_path / "none", tmp_path / "none", ExportConfig(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ops", ["llama", "mlx"])
def test_backend_models_compute_the_eager_models_results(trained_pair, ops):
    """The models built for export (ExecuTorch's or MLX's cache ops) give the dense eager models' results."""
    ref_target, ref_draft, settings = load_pair(*trained_pair, max_seq_len=64)
    target, draft, _ = load_pair(*trained_pair, max_seq_len=64, ops=ops)
    block = torch.tensor([[3] + [settings.mask_token_id] * 7])
    with torch.no_grad():
        for tokens, start in [(torch.arange(9)[None], 0), (torch.arange(4)[None] + 20, 9), (torch.arange(3)[None], 10)]:
            pos = torch.arange(start, start + tokens.shape[1])
            (logits, taps), (ref_logits, ref_taps) = target(tokens, pos), ref_target(tokens, pos)
            torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(draft(block, taps, pos), ref_draft(block, ref_taps, pos), rtol=1e-4, atol=1e-4)


def mlx_programs(trained_pair, tmp_path_factory, dtype: str, quantize: str, stock_forward: bool = True) -> Path:
    """Packaged MLX programs of the trained pair, lowered once per test run (they lower anywhere; only an
    executorch built for Apple silicon runs them)."""
    return built_once(tmp_path_factory, f"mlx-{dtype}-{quantize}-{stock_forward}", lambda out: build_programs(
        trained_pair, out, backend="mlx", dtype=dtype, quantize=quantize, stock_forward=stock_forward)) / "programs"


@pytest.mark.parametrize("dtype, quantize, bytes_per_weight, stock_forward", [
    ("fp32", "none", 4, False),
    # what ExecuTorch's MLX DFlash export defaults to: bf16 around int4 weight-only Linears and embedding,
    # packed by the delegate as 4 bits plus a bf16 scale and bias per group of 32 (int8 would be >= 1 byte)
    ("bf16", "4w", 0.5 + 2 * 2 / 32, True),
])
def test_mlx_programs_lower_with_the_mlx_delegate(trained_pair, tmp_path_factory, dtype, quantize, bytes_per_weight,
                                                   stock_forward):
    programs = mlx_programs(trained_pair, tmp_path_factory, dtype, quantize, stock_forward)
    summary = json.loads((programs / "export.json").read_text())
    eager = load_pair(*trained_pair, max_seq_len=MAX_SEQ_LEN)
    for kind, model in zip(("target", "draft"), eager):
        ops = summary["programs"][kind]["ops"]
        assert ops["delegate_calls"] == 1 and ops["delegated"] > 50
        assert ops["portable"] <= 2
        pte = (programs / f"{kind}.pte").read_bytes()
        assert b"MLXBackend" in pte
        assert summary["programs"][kind]["metadata"]["get_uses_llama_custom_ops"] is False
        weights = sum(p.numel() for p in model.parameters())  # the draft's include the borrowed embedding and head
        # one copy of the weights; a target with two methods (forward, target) has two graphs around them
        overhead = 1.2 if kind == "target" and stock_forward else 1.1
        assert bytes_per_weight <= len(pte) / weights < overhead * bytes_per_weight, kind
    if missing_backend(programs):  # MLX runs on Apple silicon only
        lacks = r"target.pte: programs need the mlx backend \(MLXBackend\), which this host's executorch runtime lacks"
        with pytest.raises(ProgramError, match=lacks):
            TargetProgram(programs / "target.pte")
    else:
        load_programs(programs)


def test_4w_quantizes_linears_and_embedding_and_keeps_a_tied_head_tied(pair, tmp_path):
    """As ExecuTorch's MLX recipe re-ties lm_head to the embedding: one int4 tensor, in the target and the
    draft that borrows both."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from dflash_et.checkpoints import builtin
    from tests.tiny_checkpoints import random_checkpoint

    target_dir = random_checkpoint(tmp_path / "target", "qwen3", tie_word_embeddings=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pair[0] / f, target_dir / f)
    builtin.write_draft(tmp_path / "draft", target_dir)
    config = ExportConfig(backend="mlx", quantize="4w", dtype="bf16")
    for model in load_pair(target_dir, tmp_path / "draft", max_seq_len=64)[:2]:
        quantize(model.to(torch.bfloat16), config)
        assert model.lm_head.weight is model.embed_tokens.weight
        layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
        assert layers and all(isinstance(m.weight, IntxUnpackedToInt8Tensor) for m in layers)
        weight = model.embed_tokens.weight
        assert weight.target_dtype == torch.int4 and tuple(weight.block_size) == (1, 32)


def test_half_precision_programs(trained_pair, tmp_path):
    """fp16 (XNNPACK) and bf16 programs run and track the fp32 model at half-precision tolerance (the
    one-layer draft: the same lowering path as the target, in a third of the time)."""
    target, draft, settings = load_pair(*trained_pair, max_seq_len=64)
    block, pos = torch.tensor([[7] + [settings.mask_token_id] * 7]), torch.arange(10)
    with torch.no_grad():
        _, taps = target(torch.arange(10)[None], pos)
        ref = draft(block, taps, pos)
    for dtype, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        export_program("draft", *trained_pair, ExportConfig(max_seq_len=64, dtype=dtype), tmp_path / dtype)
        logits = DraftProgram(tmp_path / dtype / "draft.pte")(block, taps.to(torch_dtype), pos)
        assert logits.dtype == torch_dtype
        assert (logits.float() - ref).abs().max() / ref.abs().max() < 0.05


def test_quantized_shared_weights_programs(trained_pair, quantized_shared_programs):
    """8da4w with export.shared_weights: the quantized head is stored once and both programs track eager."""
    programs = quantized_shared_programs
    summary = json.loads((programs / "export.json").read_text())
    assert summary["shared_weights"]["bytes_saved"] > 0
    assert summary["shared_weights"]["tensors"] >= 3  # the embedding, and the head's int4 data and its scales
    fp32 = summary["programs"]["draft"]["metadata"]["get_vocab_size"] * checkpoint_facts(trained_pair)["hidden_size"] * 4
    assert (programs / "shared.ptd").stat().st_size < 1.5 * fp32  # an fp32 embedding and an int4 head
    config = ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK, quantize="8da4w", shared_weights=True)
    result, _, _ = numerics(programs, trained_pair, config)
    assert result["worst"]["target_rel"].value < 0.05 and result["worst"]["draft_rel"].value < 0.05


@pytest.mark.slow  # lowers programs
def test_sliding_window_target_exports_and_matches_eager(pair, tmp_path):
    """A layer variant (Qwen3's sliding-window layers) through the llama ops' explicit-mask path, exported."""
    from dflash_et.checkpoints import builtin
    from tests.tiny_checkpoints import random_checkpoint
    from tests.tiny_programs import assert_program_matches_eager

    target_dir = random_checkpoint(tmp_path / "target", "qwen3", use_sliding_window=True, sliding_window=5,
                                   max_window_layers=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pair[0] / f, target_dir / f)
    builtin.write_draft(tmp_path / "draft", target_dir)
    export_program("target", target_dir, tmp_path / "draft", ExportConfig(max_seq_len=64, prefill_chunk=8, stock_forward=False),
                   tmp_path)
    program = TargetProgram(tmp_path / "target.pte")
    assert program.program.method_names.isdisjoint({"forward"})  # export.stock_forward=false: DFlash's method alone
    target, _, _ = load_pair(target_dir, tmp_path / "draft", max_seq_len=64)
    assert [layer.self_attn.spec.window for layer in target.layers] == [None, None, 5, 5]
    assert_program_matches_eager(program, target, [(list(range(8)), 0), (list(range(10, 18)), 8), ([3], 16),
                                                   (list(range(6)), 17), ([9] * 4, 18)])


def test_validate_of_quantized_programs_reports_what_the_quantization_costs(trained_pair, quantized_shared_programs):
    """A reduced-precision program is held to its quantized eager twin, and validate also says how far it and the
    twin moved from the fp32 model: a quantization too coarse for a model (8da4w of a Q4_1 GGUF's weights) is then
    named as such, not mistaken for a broken export. The target's values may differ from its twin's as much as the
    twin's differ from the fp32 model's (XNNPACK rounds activations its own way; a deep model grows that as it
    grows the quantization's own error); the draft, fed the eager taps, and the argmaxes keep their limits."""
    report = validate(quantized_shared_programs, *trained_pair, validate_config(prompts=1, max_new_tokens=8))
    assert report["failures"] == [], report["failures"]
    reference, quantized = report["fp32_reference"], report["quantized_model"]
    assert 0.5 < reference["token_agreement"] <= 1.0 and 0.0 < reference["target_rel_err"] < 1.0
    assert 0.5 < quantized["token_agreement"] <= 1.0 and 0.0 < quantized["target_rel_err"] < 1.0
    # nearer its twin than the fp32 model, in logits: argmax agreement alone flips with a near tie, and which
    # ties flip depends on the CPU's XNNPACK kernels (0.98 vs 1.0 on one machine, the reverse on another)
    assert report["target_rel_err"] < reference["target_rel_err"], (report["target_rel_err"], reference)
    strict = validate_config(prompts=1, max_new_tokens=8,
                             reduced={"max_rel_err": 0.0, "min_token_agreement": 1.01, "require_lossless": False})
    failures = validate(quantized_shared_programs, *trained_pair, strict)["failures"]
    target = [f for f in failures if f.startswith("target_rel_err ")]
    assert bool(target) == (report["target_rel_err"] > quantized["target_rel_err"]), (failures, report)
    assert target == [] or f" > {quantized['target_rel_err']:.3g} on " in target[0]
    [draft] = [f for f in failures if f.startswith("draft_rel_err ")]
    assert f"{report['draft_rel_err']:.3g} > 0 on " in draft
    [failure] = [f for f in failures if f.startswith("token_agreement ")]
    assert "< 1.01 (with the fp32 model: " in failure and failure.endswith("try export.quantize=8da8w)")


def test_int8_draft_head(trained_pair, programs, tmp_path_factory):
    """export.draft_head=8da8w: only the draft's head changes (int8, its own copy), beside the fp32 target as the
    pipeline keeps it (export_target does not read the setting); the draft tracks its eager twin, still proposes
    what gets accepted, and DFlash stays exact."""
    def build(out: Path) -> None:
        shutil.copytree(programs.parent / "build", out / "build")
        export_program("draft", *trained_pair, ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK,
                                                           draft_head="8da8w"), out / "build" / "draft")
        (out / "programs").mkdir()
        package([out / "build" / kind for kind in PROGRAM_KINDS], out / "programs", trained_pair[0])

    int8 = built_once(tmp_path_factory, "int8-head", build) / "programs"
    facts = checkpoint_facts(trained_pair)
    head_fp32 = facts["vocab_size"] * facts["hidden_size"] * 4
    assert (int8 / "draft.pte").stat().st_size < (programs / "draft.pte").stat().st_size - head_fp32 / 2
    summary = json.loads((int8 / "export.json").read_text())["programs"]["draft"]["linears"]["draft"]
    assert summary["bytes"] < 4 * summary["parameters"] - head_fp32 / 2
    report = validate(int8, *trained_pair, validate_config(prompts=2, max_new_tokens=16))
    assert report["failures"] == [] and report["lossless"] is True and report["sampling"]["same_distribution"]
    assert 0 < report["draft_rel_err"] < 0.05 and report["target_rel_err"] < 1e-3
    assert report["tau_by_block"]["8"] > 2.5, report["tau_by_block"]  # the trained block: proposals accepted
