"""Exported programs run through executorch.runtime and agree with the eager models; bad settings are refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from dflash_et.checkpoints.check import load_pair
from dflash_et.errors import ExportError, ProgramError
from dflash_et.export.lower import ExportConfig, export_program, quantize
from dflash_et.export.package import TOKENIZER_FILES, merge_weights, package
from dflash_et.reports.validate import ValidateConfig, call_plan, check_lossless, compare_numerics, validate
from dflash_et.runtime.programs import DraftProgram, TargetProgram, load_programs, missing_backend
from tests.conftest import (MAX_SEQ_LEN, PREFILL_CHUNK, QUICK_SAMPLING_CHECK, build_programs, built_once,
                            checkpoint_facts, validate_config)


def numerics(programs_dir, pair, export_config=None):
    progs = load_programs(programs_dir)
    eager = load_pair(*pair, max_seq_len=progs[0].meta["max_seq_len"])
    if export_config:
        quantize(eager[0], export_config)
        quantize(eager[1], export_config)
    prompts = [[1, 2, 3, 4, 5] * 7, [9, 8, 7]]
    return compare_numerics(progs, eager, prompts, ["a", "b"]), progs, eager


def test_programs_match_eager_models(programs, trained_pair):
    result, progs, _ = numerics(programs, trained_pair)
    assert result["worst"]["target_rel"].value < 1e-4
    assert result["worst"]["draft_rel"].value < 1e-4
    assert result["token_agreement"] == 1.0


def test_call_plan_covers_prefill_decode_verify_rollback():
    plan = call_plan(list(range(20)), chunk=8, block=4, max_seq_len=64)
    assert [(len(t), s) for t, s in plan] == [(8, 0), (8, 8), (4, 16), (1, 20), (4, 21), (4, 23)]


def test_programs_are_self_describing(programs, trained_pair):
    target, draft = load_programs(programs)
    facts = checkpoint_facts(trained_pair)
    assert target.meta["max_seq_len"] == draft.meta["max_seq_len"] == MAX_SEQ_LEN
    assert target.meta["eos_ids"] == facts["eos_ids"]
    assert target.meta["target_layer_ids"] == draft.meta["target_layer_ids"] == facts["target_layer_ids"]
    assert draft.meta["target_checkpoint_id"] == target.meta["checkpoint_id"] != draft.meta["checkpoint_id"]
    assert target.meta["vocab_size"] == facts["vocab_size"] and target.meta["max_chunk"] == PREFILL_CHUNK
    assert draft.meta["mask_token_id"] == facts["mask_token_id"] and draft.meta["max_block_size"] == facts["block_size"]
    assert {f.name for f in programs.iterdir()} >= {"target.pte", "draft.pte", "tokenizer.json", "tokenizer_config.json"}
    summary = json.loads((programs / "export.json").read_text())
    for kind in ("target", "draft"):
        ops = summary["programs"][kind]["ops"]
        assert ops["delegated"] > 0 and ops["delegate_calls"] > 0
        assert summary["programs"][kind]["bytes"] == (programs / f"{kind}.pte").stat().st_size


def test_dflash_over_programs_accepts_proposals_and_is_lossless(programs, trained_pair):
    """The trained draft's proposals are mostly accepted through the programs (so the draft's context
    cache after accepted rounds is exercised), at every block size, and DFlash stays exact."""
    from dflash_et.data.prompts import builtin_prompts, encode_chat, tokenizer

    progs = load_programs(programs)
    facts = checkpoint_facts(trained_pair)
    tok = tokenizer(programs)
    prompts = [encode_chat(tok, r["prompt"]) for r in builtin_prompts(6)]
    blocks = list(range(2, facts["block_size"] + 1))
    fraction, why, taus = check_lossless(progs, prompts, [f"p{i}" for i in range(6)], set(facts["eos_ids"]), 32,
                                         facts["mask_token_id"], blocks)
    assert fraction == 1.0 and why is None, why
    assert sorted(taus) == blocks
    assert sum(taus[blocks[-1]]) / len(prompts) > 2.5, taus  # several proposals accepted per round


def test_validate_passes_and_reports(programs, trained_pair):
    report = validate(programs, *trained_pair, validate_config(prompts=2, max_new_tokens=16))
    assert report["failures"] == [] and report["lossless"] is True and report["sampling"]["same_distribution"]
    assert report["target_max_abs_err"] < 1e-3 and report["token_agreement"] == 1.0


def test_failed_checks_say_which_by_how_much_and_where(programs, trained_pair):
    strict = validate_config(prompts=1, max_new_tokens=8,
                             fp32={"max_rel_err": 1e-12, "min_token_agreement": 1.0, "require_lossless": True})
    failures = validate(programs, *trained_pair, strict)["failures"]
    assert len(failures) == 2
    assert failures[0].startswith("target_rel_err ") and " > 1e-12 on prompt 0 ('" in failures[0]
    assert failures[1].startswith("draft_rel_err ") and "on prompt 0 (" in failures[1]


def test_validate_stage_fails_with_the_failures(programs, trained_pair, tmp_path, monkeypatch):
    import stages.validate as stage

    monkeypatch.setattr(stage, "params", lambda: {"validate": {
        "prompts": 1, "max_new_tokens": 8, "fp32": {"max_rel_err": 1e-12, "min_token_agreement": 1.0,
                                                    "require_lossless": True}, "sampling": QUICK_SAMPLING_CHECK}})
    with pytest.raises(SystemExit, match="error: validate failed: target_rel_err .* on prompt 0"):
        stage.main([str(programs), str(trained_pair[0]), str(trained_pair[1]), str(tmp_path / "validate.json")])
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
        package([build / "target", build / "draft"], tmp_path / "out", tmp_path)


def test_package_ships_the_tokenizer_or_refuses(programs, trained_pair, tmp_path):
    shipped = json.loads((programs / "export.json").read_text())["tokenizer"]
    assert shipped and set(shipped) <= set(TOKENIZER_FILES)
    for f in shipped:
        assert (programs / f).read_bytes() == (trained_pair[0] / f).read_bytes()
    (tmp_path / "out").mkdir()
    with pytest.raises(ExportError, match="has no tokenizer files"):
        package([programs.parent / "build" / k for k in ("target", "draft")], tmp_path / "out", tmp_path / "nothing")


def test_block_size_beyond_the_cache_is_refused(pair, tmp_path):
    with pytest.raises(ExportError, match="export.max_block_size=40 must be in 2..max_seq_len-2"):
        export_program("draft", *pair, ExportConfig(max_seq_len=32, max_block_size=40), tmp_path)


def test_validate_refuses_programs_of_another_checkpoint(programs, trained_pair, tmp_path):
    other = tmp_path / "target"
    shutil.copytree(trained_pair[0], other)
    (other / "fingerprint.json").unlink()  # a checkpoint nobody fetched: its fingerprint is computed
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ProgramError, match=f"target.pte was exported from another checkpoint than {other}"):
        validate(programs, other, trained_pair[1], ValidateConfig(prompts=1))


def test_programs_of_different_pairs_are_refused(programs, trained_pair, tmp_path):
    """A draft exported for another target (here: the same target, other layers) does not load with it."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(programs / "target.pte", mixed / "target.pte")
    draft_dir = tmp_path / "draft"
    shutil.copytree(trained_pair[1], draft_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
    (draft_dir / "config.json").write_text(json.dumps(config))
    (draft_dir / "train_draft.json").unlink()
    export_program("draft", trained_pair[0], draft_dir, ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK),
                   mixed)
    with pytest.raises(ProgramError, match="draft.pte was exported for another target than"):
        load_programs(mixed)


def test_shared_weights(shared_programs, programs, trained_pair):
    """A trained draft's layers differ from the target's (norms included); only the borrowed embedding and
    head are shared, once, and the programs stay exact."""
    summary = json.loads((shared_programs / "export.json").read_text())["shared_weights"]
    facts = checkpoint_facts(trained_pair)
    embed_and_head = 2 * facts["vocab_size"] * facts["hidden_size"] * 4
    assert 0.99 * embed_and_head <= summary["bytes_saved"] < 1.01 * embed_and_head  # minus headers and padding
    assert 0.99 * embed_and_head <= summary["shared_bytes"] < 1.01 * embed_and_head
    for kind in ("target", "draft"):  # each program keeps its own layers and lost the shared bytes
        saved = (programs / f"{kind}.pte").stat().st_size - (shared_programs / f"{kind}.pte").stat().st_size
        assert 0.99 * embed_and_head <= saved < 1.01 * embed_and_head, kind
    result, _, _ = numerics(shared_programs, trained_pair)
    assert result["worst"]["target_rel"].value < 1e-4 and result["worst"]["draft_rel"].value < 1e-4
    progs = load_programs(shared_programs)
    fraction, why, _ = check_lossless(progs, [[3, 4, 5, 6] * 4], ["a"], set(facts["eos_ids"]), 24,
                                      facts["mask_token_id"])
    assert fraction == 1.0, why


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
    ({"colour": "red"}, "unknown export params \\['colour'\\]"),
])
def test_bad_export_settings(params, message):
    with pytest.raises(ExportError, match=message):
        ExportConfig.from_params(params)


@pytest.mark.parametrize("cache", ["llama", "mlx"])
def test_backend_models_compute_the_eager_models_results(trained_pair, cache):
    """The models built for export (ExecuTorch's or MLX's cache ops) give the dense eager models' results."""
    ref_target, ref_draft, settings = load_pair(*trained_pair, max_seq_len=64)
    target, draft, _ = load_pair(*trained_pair, max_seq_len=64, cache=cache)
    block = torch.tensor([[3] + [settings.mask_token_id] * 7])
    with torch.no_grad():
        for tokens, start in [(torch.arange(9)[None], 0), (torch.arange(4)[None] + 20, 9), (torch.arange(3)[None], 10)]:
            pos = torch.arange(start, start + tokens.shape[1])
            (logits, taps), (ref_logits, ref_taps) = target(tokens, pos), ref_target(tokens, pos)
            torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(draft(block, taps, pos), ref_draft(block, ref_taps, pos), rtol=1e-4, atol=1e-4)


def mlx_programs(trained_pair, tmp_path_factory, dtype: str, quantize: str) -> Path:
    """Packaged MLX programs of the trained pair, lowered once per test run (they lower anywhere; only an
    executorch built for Apple silicon runs them)."""
    return built_once(tmp_path_factory, f"mlx-{dtype}-{quantize}", lambda out: build_programs(
        trained_pair, out, backend="mlx", dtype=dtype, quantize=quantize)) / "programs"


@pytest.mark.parametrize("dtype, quantize, bytes_per_weight", [
    ("fp32", "none", 4),
    # what ExecuTorch's MLX DFlash export defaults to: bf16 around int4 weight-only Linears and embedding,
    # packed by the delegate as 4 bits plus a bf16 scale and bias per group of 32 (int8 would be >= 1 byte)
    ("bf16", "4w", 0.5 + 2 * 2 / 32),
])
def test_mlx_programs_lower_with_the_mlx_delegate(trained_pair, tmp_path_factory, dtype, quantize, bytes_per_weight):
    programs = mlx_programs(trained_pair, tmp_path_factory, dtype, quantize)
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
        assert bytes_per_weight <= len(pte) / weights < 1.1 * bytes_per_weight, kind
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
    from tests.conftest import random_checkpoint

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


def test_quantized_shared_weights_programs(trained_pair, tmp_path):
    """8da4w with export.shared_weights: the quantized head is stored once and both programs track eager."""
    programs = build_programs(trained_pair, tmp_path, quantize="8da4w", shared_weights=True)
    summary = json.loads((programs / "export.json").read_text())
    assert summary["shared_weights"]["bytes_saved"] > 0
    assert summary["shared_weights"]["tensors"] >= 3  # the embedding, and the head's int4 data and its scales
    fp32 = summary["programs"]["draft"]["metadata"]["get_vocab_size"] * checkpoint_facts(trained_pair)["hidden_size"] * 4
    assert (programs / "shared.ptd").stat().st_size < 1.5 * fp32  # an fp32 embedding and an int4 head
    config = ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK, quantize="8da4w", shared_weights=True)
    result, _, _ = numerics(programs, trained_pair, config)
    assert result["worst"]["target_rel"].value < 0.05 and result["worst"]["draft_rel"].value < 0.05


def test_sliding_window_target_exports_and_matches_eager(pair, tmp_path):
    """A layer variant (Qwen3's sliding-window layers) through the llama ops' explicit-mask path, exported."""
    from dflash_et.checkpoints import builtin
    from tests.conftest import random_checkpoint

    target_dir = random_checkpoint(tmp_path / "target", "qwen3", use_sliding_window=True, sliding_window=5,
                                   max_window_layers=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pair[0] / f, target_dir / f)
    builtin.write_draft(tmp_path / "draft", target_dir)
    export_program("target", target_dir, tmp_path / "draft", ExportConfig(max_seq_len=64, prefill_chunk=8), tmp_path)
    program = TargetProgram(tmp_path / "target.pte")
    target, _, _ = load_pair(target_dir, tmp_path / "draft", max_seq_len=64)
    assert [layer.self_attn.spec.window for layer in target.layers] == [None, None, 5, 5]
    for tokens, start in [(list(range(8)), 0), (list(range(10, 18)), 8), ([3], 16), (list(range(6)), 17), ([9] * 4, 18)]:
        x, pos = torch.tensor([tokens]), torch.arange(start, start + len(tokens))
        with torch.no_grad():
            ref_logits, ref_taps = target(x, pos)
        logits, taps = program(x, pos)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(taps, ref_taps, rtol=1e-4, atol=1e-4)
