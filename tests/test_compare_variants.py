"""`dflash compare` (dflash_et.evaluate.variants): both variants trained for one target under the same settings, benched on one target.pte."""

import json

import pytest

from dflash_et.errors import UserError
from dflash_et.params import Model
from tests.tiny_programs import MAX_SEQ_LEN, PREFILL_CHUNK

TINY = {
    "block_size": 4,
    "model": Model(),
    "train_draft": dict(steps=30, num_prompts=16, heldout=2, max_new_tokens=16, block_size=8, anchors=4, batch=2,
                        num_layers=1, prompts="builtin"),
    "export": dict(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK, stock_forward=False),
    "bench": dict(prompts="builtin", num_prompts=2, long_prompts=0, max_new_tokens=8, warmup=0, latency_repeats=1,
                  block_sizes=[4]),
}


def test_compare_trains_each_variant_and_benches_it_beside_one_target(trained_pair, tmp_path, monkeypatch):
    from dflash_et.evaluate import variants

    out = tmp_path / "compare"
    results = variants.compare(out, str(trained_pair[0]), ["dflash", "dflash2"], TINY)
    assert list(results) == ["dflash", "dflash2"]
    for variant, result in results.items():
        assert json.loads((out / variant / "draft" / "config.json").read_text())["architectures"] == [
            {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}[variant]]
        assert result["lossless"] is True and result["steps"] == 30 and result["tau"] >= 1
        assert result["draft_ms_per_round"] > 0 and set(result["tau_by_category"]) <= {"math", "code", "chat"}
    targets = [(out / v / "programs" / "target.pte").resolve().read_bytes() for v in results]
    assert targets[0] == targets[1]  # one target.pte for both
    assert json.loads((out / "compare.json").read_text()) == results
    lines = variants.table(results)
    assert lines[0] == " | dflash | dflash2" and any(line.startswith("draft ms/round | ") for line in lines)

    def refuse(*args, **kwargs):
        raise AssertionError("a rerun with the same settings trains nothing")

    monkeypatch.setattr(variants, "train_draft", refuse)
    assert variants.compare(out, str(trained_pair[0]), ["dflash", "dflash2"], TINY).keys() == results.keys()
    with pytest.raises(UserError, match="holds a comparison made with other settings .*: pass a new OUT_DIR"):
        variants.compare(out, str(trained_pair[0]), ["dflash"], TINY)
