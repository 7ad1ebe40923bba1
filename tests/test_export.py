"""fp32 XNNPACK programs (with and without shared weights) run through executorch.runtime, agree with the eager
models, validate and package; programs that do not belong together are refused. Other backends, dtypes and
quantizations: test_export_variants.py."""

import json
import re
import shutil

import pytest

from dflash_et.errors import REBUILD, ExportError, ProgramError
from dflash_et.export.config import ExportConfig
from dflash_et.export.lower import export_program
from dflash_et.export.package import TOKENIZER_FILES, merge_weights, package
from dflash_et.evaluate.validate import ValidateConfig, call_plan, check_lossless, validate
from dflash_et.runtime.programs import DraftProgram, TargetProgram, load_programs
from tests.tiny_checkpoints import checkpoint_facts
from tests.tiny_programs import (MAX_SEQ_LEN, PREFILL_CHUNK, QUICK_SAMPLING_CHECK, flat_cost_curve, numerics,
                                 validate_config)


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
    assert target.meta.max_context_len == draft.meta.max_context_len == MAX_SEQ_LEN
    assert list(target.meta.eos_ids) == facts["eos_ids"]
    assert list(target.meta.target_layer_ids) == list(draft.meta.target_layer_ids) == facts["target_layer_ids"]
    assert draft.meta.target_checkpoint_id == target.meta.checkpoint_id != draft.meta.draft_checkpoint_id
    assert target.meta.vocab_size == facts["vocab_size"] and target.meta.max_seq_len == PREFILL_CHUNK
    assert draft.meta.mask_token_id == facts["mask_token_id"] and draft.meta.max_block_len == facts["block_size"]
    assert {f.name for f in programs.iterdir()} >= {"target.pte", "draft.pte", "tokenizer.json", "tokenizer_config.json"}
    summary = json.loads((programs / "export.json").read_text())
    for kind in ("target", "draft"):
        ops = summary["programs"][kind]["ops"]
        assert ops["delegated"] > 0 and ops["delegate_calls"] > 0
        assert summary["programs"][kind]["bytes"] == (programs / f"{kind}.pte").stat().st_size


def test_dflash_over_programs_accepts_proposals_and_is_lossless(programs, trained_pair, monkeypatch):
    """The trained draft's proposals are mostly accepted through the programs (so the draft's context
    cache after accepted rounds is exercised), at every block size, and DFlash stays exact. auto plans by a fixed
    curve (flat_cost_curve): what it does here is the draft's to decide, not the machine's load."""
    import dflash_et.evaluate.validate as validate_module
    from dflash_et.data.chat import encode_chat, tokenizer
    from dflash_et.data.prompts import builtin_prompts

    monkeypatch.setattr(validate_module, "measure_cost_curve", flat_cost_curve)

    progs = load_programs(programs)
    facts = checkpoint_facts(trained_pair)
    tok = tokenizer(programs)
    prompts = [encode_chat(tok, r["prompt"]) for r in builtin_prompts(6)]
    blocks = [*range(2, facts["block_size"] + 1), "auto"]
    fraction, why, taus = check_lossless(progs, prompts, [f"p{i}" for i in range(6)], set(facts["eos_ids"]), 32,
                                         facts["mask_token_id"], blocks)
    assert fraction == 1.0 and why is None, why
    assert list(taus) == blocks
    assert sum(taus[facts["block_size"]]) / len(prompts) > 2.5, taus  # several proposals accepted per round
    assert sum(taus["auto"]) / len(prompts) > 2.5, taus


def test_validate_passes_and_reports(programs, trained_pair):
    report = validate(programs, *trained_pair, validate_config(prompts=2, max_new_tokens=16))
    assert report["failures"] == [] and report["lossless"] is True and report["sampling"]["same_distribution"]
    assert set(report["tau_by_block"]) == {"2", "8", "auto"}
    assert report["target_max_abs_err"] < 1e-3 and report["token_agreement"] == 1.0


def test_failed_checks_say_which_by_how_much_and_where(programs, trained_pair):
    strict = validate_config(prompts=1, max_new_tokens=8,
                             fp32={"max_rel_err": 1e-12, "min_token_agreement": 1.0, "require_lossless": True})
    failures = validate(programs, *trained_pair, strict)["failures"]
    assert len(failures) == 4
    assert failures[0].startswith("target_rel_err ") and " > 1e-12 on prompt 0 ('" in failures[0]
    assert failures[1].startswith("draft_rel_err ") and "on prompt 0 (" in failures[1]
    for failure, output in zip(failures[2:], ("logits", "taps")):  # the independent oracle fails too
        assert failure.startswith(f"target {output} differ from transformers' model by ") and "> 1e-12" in failure


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


def test_package_takes_each_programs_own_settings(programs, trained_pair, tmp_path):
    """A setting only one program reads changes only that program's export (its stage alone reruns): package
    takes the target's (prefill_chunk, stock_forward) from the target and the draft's (draft_head) from the draft."""
    build = tmp_path / "build"
    for kind in ("target", "draft"):
        shutil.copytree(programs.parent / "build" / kind, build / kind)
    for kind, setting in (("target", {"prefill_chunk": 32}), ("draft", {"draft_head": "8da8w"})):
        summary = json.loads((build / kind / "export.json").read_text())
        summary["config"] |= setting
        (build / kind / "export.json").write_text(json.dumps(summary))
    (tmp_path / "out").mkdir()
    config = package([build / "target", build / "draft"], tmp_path / "out", trained_pair[0])["config"]
    assert config["prefill_chunk"] == 32 and config["draft_head"] == "8da8w"


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


def test_programs_of_different_pairs_are_refused(mixed_programs):
    """A draft exported for another target (here: the same target, other layers) does not load with it."""
    with pytest.raises(ProgramError, match="draft.pte was exported for another target than"):
        load_programs(mixed_programs)


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
    with pytest.raises(ProgramError, match=rf"^{tmp_path}/missing.ptd is missing \(the programs keep their weights "
                                           r"there: export.shared_weights\): " + re.escape(REBUILD) + "$"):
        TargetProgram(shared_programs / "target.pte", tmp_path / "missing.ptd")
    with pytest.raises(ProgramError, match=rf"^{tmp_path}/draft.pte is missing: " + re.escape(REBUILD) + "$"):
        DraftProgram(tmp_path / "draft.pte")


def test_merge_refuses_conflicting_tensors(shared_programs, tmp_path):
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    files = []
    for i, data in enumerate([b"\x00" * 64, b"\x01" * 64]):
        payload = DataPayload(buffers=[data], named_data={"embed_tokens.weight": DataEntry(0, 64, None)})
        files.append(tmp_path / f"{i}.ptd")
        files[-1].write_bytes(bytes(FlatTensorSerializer().serialize(payload)))
    with pytest.raises(ExportError, match="'embed_tokens.weight' differs"):
        merge_weights(files, tmp_path / "shared.ptd")
