"""Exported programs run through executorch.runtime and agree with the eager models; bad settings are refused."""

import json
import shutil

import pytest
import torch

from dflash_et.checkpoint import load_pair
from dflash_et.export import ExportConfig, ExportError, export_program, merge_weights, package, quantize
from dflash_et.programs import DraftProgram, ProgramError, TargetProgram, load_programs
from dflash_et.validate import Limits, ValidateConfig, call_plan, check_lossless, compare_numerics, validate


def numerics(programs_dir, pair, export_config=None):
    progs = load_programs(programs_dir)
    eager = load_pair(*pair, max_seq_len=progs[0].meta["max_seq_len"])
    if export_config:
        quantize(eager[0], export_config)
        quantize(eager[1], export_config)
    prompts = [[1, 2, 3, 4, 5] * 7, [9, 8, 7]]
    return compare_numerics(progs, eager, prompts, ["a", "b"]), progs, eager


def test_programs_match_eager_models(programs, pair):
    result, progs, _ = numerics(programs, pair)
    assert result["worst"]["target_rel"].value < 1e-4
    assert result["worst"]["draft_rel"].value < 1e-4
    assert result["token_agreement"] == 1.0


def test_call_plan_covers_prefill_decode_verify_rollback():
    plan = call_plan(list(range(20)), chunk=8, block=4, max_seq_len=64)
    assert [(len(t), s) for t, s in plan] == [(8, 0), (8, 8), (4, 16), (1, 20), (4, 21), (4, 23)]


def test_programs_are_self_describing(programs, pair):
    target, draft = load_programs(programs)
    assert target.meta["max_seq_len"] == draft.meta["max_seq_len"] == 128
    assert target.meta["eos_ids"] == [0, 2] and target.meta["target_layer_ids"] == draft.meta["target_layer_ids"] == [1, 3]
    assert draft.meta["target_checkpoint_id"] == target.meta["checkpoint_id"] != draft.meta["checkpoint_id"]
    assert target.meta["vocab_size"] == 2048 and target.meta["max_chunk"] == 16
    assert draft.meta["mask_token_id"] == 5 and draft.meta["max_block_size"] == 16
    summary = json.loads((programs / "export.json").read_text())
    for kind in ("target", "draft"):
        ops = summary["programs"][kind]["ops"]
        assert ops["delegated"] > 0 and ops["delegate_calls"] > 0
        assert summary["programs"][kind]["bytes"] == (programs / f"{kind}.pte").stat().st_size


def test_dflash_over_programs_is_lossless(programs, pair):
    progs = load_programs(programs)
    prompts = [[1, 2, 3, 4, 5] * 5, [10, 20, 30]]
    fraction, why, taus = check_lossless(progs, prompts, ["a", "b"], {0, 2}, 24, mask_token_id=5)
    assert fraction == 1.0 and why is None and set(taus) == {2, 16}


def test_validate_passes_and_reports(programs, pair):
    report = validate(programs, *pair, ValidateConfig(prompts=2, max_new_tokens=16))
    assert report["failures"] == [] and report["lossless"] is True
    assert report["target_max_abs_err"] < 1e-3 and report["token_agreement"] == 1.0


def test_failed_checks_say_which_by_how_much_and_where(programs, pair):
    strict = ValidateConfig(prompts=1, max_new_tokens=8, fp32=Limits(1e-12, 1.0, True))
    failures = validate(programs, *pair, strict)["failures"]
    assert len(failures) == 2
    assert failures[0].startswith("target_rel_err ") and " > 1e-12 on prompt 0 ('" in failures[0]
    assert failures[1].startswith("draft_rel_err ") and "on prompt 0 (" in failures[1]


def test_validate_stage_fails_with_the_failures(programs, pair, tmp_path, monkeypatch):
    import stages.validate as stage

    monkeypatch.setattr(stage, "PROGRAMS", programs)
    monkeypatch.setattr(stage, "REPORTS", tmp_path)
    monkeypatch.setattr(stage, "WEIGHTS", pair[0].parent)
    monkeypatch.setattr(stage, "params", lambda: {"validate": {
        "prompts": 1, "max_new_tokens": 8, "fp32": {"max_rel_err": 1e-12, "min_token_agreement": 1.0,
                                                    "require_lossless": True}}})
    with pytest.raises(SystemExit, match="error: validate failed: target_rel_err .* on prompt 0"):
        stage.main()
    assert json.loads((tmp_path / "validate.json").read_text())["failures"]


def test_package_refuses_programs_exported_differently(programs, tmp_path):
    build = tmp_path / "build"
    for kind in ("target", "draft"):
        shutil.copytree(programs.parent / "build" / kind, build / kind)
    summary = json.loads((build / "draft" / "export.json").read_text())
    summary["config"]["max_seq_len"] = 256
    (build / "draft" / "export.json").write_text(json.dumps(summary))
    (tmp_path / "out").mkdir()
    with pytest.raises(ExportError, match="exported with different settings"):
        package([build / "target", build / "draft"], tmp_path / "out")


def test_block_size_beyond_the_cache_is_refused(pair, tmp_path):
    with pytest.raises(ExportError, match="export.max_block_size=40 must be in 2..max_seq_len-2"):
        export_program("draft", *pair, ExportConfig(max_seq_len=32, max_block_size=40), tmp_path)


def test_validate_refuses_programs_of_another_checkpoint(programs, pair, tmp_path):
    other = tmp_path / "target"
    shutil.copytree(pair[0], other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ProgramError, match=f"target.pte was exported from another checkpoint than {other}"):
        validate(programs, other, pair[1], ValidateConfig(prompts=1))


def test_programs_of_different_pairs_are_refused(programs, pair, tmp_path):
    """A draft exported for another target (here: the same target, other layers) does not load with it."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(programs / "target.pte", mixed / "target.pte")
    draft_dir = tmp_path / "draft"
    shutil.copytree(pair[1], draft_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [2, 4]
    (draft_dir / "config.json").write_text(json.dumps(config))
    export_program("draft", pair[0], draft_dir, ExportConfig(max_seq_len=128, prefill_chunk=16), mixed)
    with pytest.raises(ProgramError, match="draft.pte was exported for another target than"):
        load_programs(mixed)


def test_shared_weights(shared_programs, programs, pair):
    summary = json.loads((shared_programs / "export.json").read_text())["shared_weights"]
    embed_and_head = 2 * 2048 * 256 * 4
    assert 0.99 * embed_and_head <= summary["bytes_saved"] < 1.01 * embed_and_head  # minus headers and padding
    assert (shared_programs / "target.pte").stat().st_size < 1_000_000  # weights are in shared.ptd
    result, _, _ = numerics(shared_programs, pair)
    assert result["worst"]["target_rel"].value < 1e-4 and result["worst"]["draft_rel"].value < 1e-4


def test_program_without_its_ptd_is_a_clear_error(shared_programs, tmp_path):
    with pytest.raises(ProgramError, match="needs its .ptd weights file"):
        TargetProgram(shared_programs / "target.pte")
    with pytest.raises(ProgramError, match="does not exist"):
        TargetProgram(shared_programs / "target.pte", tmp_path / "missing.ptd")
    with pytest.raises(ProgramError, match="run `dvc repro`"):
        DraftProgram(tmp_path / "draft.pte")


def test_merge_refuses_conflicting_tensors(shared_programs, tmp_path):
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    files = []
    for i, data in enumerate([b"\x00" * 64, b"\x01" * 64]):
        payload = DataPayload(buffers=[data], named_data={"embed_tokens.weight": DataEntry(0, 64, None)})
        files.append(tmp_path / f"{i}.ptd")
        files[-1].write_bytes(bytes(FlatTensorSerializer().serialize(payload)))
    with pytest.raises(ExportError, match="'embed_tokens.weight' differs"):
        merge_weights(files, tmp_path / "shared.ptd")


def test_quantized_draft_runs_and_tracks_eager(pair, tmp_path):
    config = ExportConfig(max_seq_len=64, quantize="8da4w")
    export_program("draft", *pair, config, tmp_path)
    program = DraftProgram(tmp_path / "draft.pte")
    assert json.loads((tmp_path / "export.json").read_text())["bytes"] < 6_000_000  # fp32 draft: 12 MB
    target, draft, settings = load_pair(*pair, max_seq_len=64)
    quantize(draft, config)
    with torch.no_grad():
        _, taps = target(torch.arange(10)[None], torch.arange(10))
        for b in (2, 9, 16):
            block = torch.tensor([[7] + [settings.mask_token_id] * (b - 1)])
            ref = draft(block, taps, torch.arange(10))
            got = program(block, taps, torch.arange(10))
            assert (got - ref).abs().max() / ref.abs().max() < 0.05


def test_portable_target_runs_without_delegates(pair, tmp_path):
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
    ({"quantize": "4w"}, "weight-only configs lower to XNNPACK but compute wrong outputs"),
    ({"quantize": "int8_weight_only"}, "weight-only"),
    ({"quantize": "8da4w", "backend": "portable"}, "needs the xnnpack backend"),
    ({"dtype": "fp64"}, "export.dtype='fp64' does not exist; use one of fp32, fp16, bf16"),
    ({"dtype": "bf16", "quantize": "8da4w"}, "set export.dtype=fp32"),
    ({"max_seq_len": 2}, "max_seq_len >= 4"),
    ({"colour": "red"}, "unknown export params \\['colour'\\]"),
])
def test_bad_export_settings(params, message):
    with pytest.raises(ExportError, match=message):
        ExportConfig.from_params(params)


def test_mlx_attention_ops_compute_the_same(pair):
    """The MLX backend swaps in mlx:: cache ops; eagerly they must give the llama ops' results."""
    from dflash_et.model import Attention

    ref_target, ref_draft, settings = load_pair(*pair, max_seq_len=64)
    target, draft, _ = load_pair(*pair, max_seq_len=64)
    for module in [*target.modules(), *draft.modules()]:
        if isinstance(module, Attention):
            module.use_mlx_ops()
    block = torch.tensor([[3] + [settings.mask_token_id] * 7])
    with torch.no_grad():
        for tokens, start in [(torch.arange(9)[None], 0), (torch.arange(4)[None] + 20, 9), (torch.arange(3)[None], 10)]:
            pos = torch.arange(start, start + tokens.shape[1])
            (logits, taps), (ref_logits, ref_taps) = target(tokens, pos), ref_target(tokens, pos)
            torch.testing.assert_close(logits, ref_logits)
            torch.testing.assert_close(draft(block, taps, pos), ref_draft(block, ref_taps, pos))


def test_mlx_programs_lower_with_the_mlx_delegate(pair, tmp_path):
    config = ExportConfig(backend="mlx", max_seq_len=64)
    for kind in ("target", "draft"):
        export_program(kind, *pair, config, tmp_path / kind)
        summary = json.loads((tmp_path / kind / "export.json").read_text())
        assert summary["ops"]["delegate_calls"] == 1 and summary["ops"]["delegated"] > 100
        assert summary["ops"]["portable"] <= 2
        assert b"MLXBackend" in (tmp_path / kind / f"{kind}.pte").read_bytes()
        assert summary["metadata"]["get_uses_llama_custom_ops"] is False
    with pytest.raises(ProgramError, match="cannot be loaded by executorch.runtime"):
        TargetProgram(tmp_path / "target" / "target.pte")  # MLX runs on Apple silicon only


def test_half_precision_programs(pair, tmp_path):
    """fp16 (XNNPACK) and bf16 programs run and track the fp32 model at half-precision tolerance."""
    target, _, _ = load_pair(*pair, max_seq_len=64)
    tokens, pos = torch.arange(6)[None], torch.arange(6)
    with torch.no_grad():
        ref_logits, _ = target(tokens, pos)
    for dtype, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        export_program("target", *pair, ExportConfig(max_seq_len=64, dtype=dtype), tmp_path / dtype)
        logits, taps = TargetProgram(tmp_path / dtype / "target.pte")(tokens, pos)
        assert logits.dtype == torch_dtype and taps.dtype == torch_dtype
        assert (logits.float() - ref_logits).abs().max() / ref_logits.abs().max() < 0.05
