"""`dflash train-draft` on a bare machine (no ExecuTorch, no DVC), its card, its refusals, and the drafts
that ship with the project: `model.draft: auto` takes the one trained for the target, and only that one."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_et.checkpoints.fetch import fetch, shipped_draft
from dflash_et.errors import CheckpointError
from dflash_et.training.state import host
from dflash_et.training.train import TrainConfig, train_draft
from tests import REPO

# What a bare GPU machine lacks: the command must run without any of them (gguf only matters for a .gguf target)
ABSENT = ("executorch", "dvc", "dvclive", "gguf", "torchao")
BARE = f"""
import runpy, sys
for name in {ABSENT!r}:  # None in sys.modules: `import` fails and find_spec says absent, as on a machine without it
    sys.modules[name] = None
sys.argv = ["dflash", "train-draft", *sys.argv[1:]]  # as tools/gpu/train_smollm2.sh runs it, nothing installed
runpy.run_module("dflash_et.cli", run_name="__main__")
loaded = sorted(m for m, module in sys.modules.items() if m.split(".")[0] in {ABSENT!r} and module is not None)
assert not loaded, loaded
"""
TINY = ["--set", "steps=30", "--set", "num_prompts=6", "--set", "heldout=2", "--set", "max_new_tokens=8",
        "--set", "batch=2", "--set", "anchors=4", "--set", "block_size=8", "--set", "generate_batch=16"]


def bare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BARE, *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_tool_trains_on_a_bare_machine_and_writes_its_card(tmp_path):
    out = tmp_path / "draft"
    r = bare("builtin-random", str(out), "--minutes", "5", "--device", "cpu", *TINY, "--set", "synthetic_prompts=8",
             "--set", "curve_points=2", "--dtype", "bf16", "--shard-mb", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    card = json.loads((out / "train_draft.json").read_text())
    assert card["steps"] == 30 and card["config"]["device"] == "cpu" and card["config"]["minutes"] < 5
    assert card["data"]["prompts"]["set"] == 6 and card["data"]["heldout_prompts"] == 2
    assert card["data"]["prompts"]["synthetic_examples"]  # the random target writes some: shown in the card
    assert card["data"]["sequences"] == card["train_sequences"] == 6 + card["data"]["prompts"]["synthetic"]
    assert [p["step"] for p in card["curve"]] == [0, 10, 20, 30]
    assert all(later["rows"] > earlier["rows"] for earlier, later in zip(card["curve"], card["curve"][1:]))
    assert card["curve"][-1]["heldout_tau"] == card["heldout_tau"]
    seconds = card["timings"]["seconds"]
    for phase in ("fetching target", "loading", "synthesis", "replies", "evaluation", "training", "total"):
        assert seconds[phase] >= 0, phase
    assert seconds["total"] >= sum(v for k, v in seconds.items() if k != "total") - 0.5
    assert card["timings"]["block_rows_per_s"] > 0 and card["timings"]["reply_tokens_per_s"] > 0
    assert card["timings"]["device"] == f"cpu (cpu, {host()})" and card["timings"]["dtype"] == "fp32"
    assert set(card["versions"]) == {"python", "torch", "transformers"}
    assert card["command"].startswith("dflash train-draft builtin-random ")
    fetch("target", "builtin-random", tmp_path / "target")  # the same target, as the pipeline fetches it
    assert card["target_checkpoint_id"] == json.loads((tmp_path / "target" / "fingerprint.json").read_text())[
        "checkpoint_id"]
    fetch("draft", str(out), tmp_path / "fetched", target_dir=tmp_path / "target")  # loads and fits
    from safetensors.torch import load_file

    assert card["weights_dtype"] == "bf16"
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) > 1 and sorted(p.name for p in out.glob("*.safetensors")) == shards
    for shard in shards:  # each within the size asked for (a tensor larger than it would get a file of its own)
        weights = load_file(out / shard)
        assert {str(w.dtype) for w in weights.values()} == {"torch.bfloat16"}
        assert sum(w.nbytes for w in weights.values()) <= 1e6 or len(weights) == 1


@pytest.mark.parametrize("args, error", [
    (["--device", "cuda"], "error: train_draft.device=cuda, but this torch (.*) sees no CUDA GPU; use cpu or auto"),
    (["--set", "steps"], "error: --set 'steps' is not KEY=VALUE; for example --set synthetic_prompts=20000"),
    (["--set", "stepz=3"], "error: train_draft.stepz is not a setting; the train_draft section takes steps, .*"),
])
def test_bad_settings_are_one_line_and_write_nothing(tmp_path, args, error):
    r = subprocess.run([sys.executable, "-m", "dflash_et.cli", "train-draft", "builtin-random", str(tmp_path / "out"), *args],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and re.fullmatch(error, r.stderr.strip()), r.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def shipped(pair, tmp_path_factory) -> Path:
    """A drafts/ folder with a draft trained here for the random pair's target (the way a GPU-trained draft ships:
    its directory and card) and one trained for another target."""
    root = tmp_path_factory.mktemp("shipped")
    config = TrainConfig(steps=3, num_prompts=2, heldout=1, max_new_tokens=4, block_size=4, anchors=2, batch=1,
                         max_seq_len=128)
    train_draft(pair[0], root / "drafts" / "mine", config)
    other = root / "other-target"
    shutil.copytree(pair[0], other)
    (other / "fingerprint.json").unlink()
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()), "note": "ft"}))
    train_draft(other, root / "drafts" / "theirs", config)
    return root / "drafts"


def untrainable(target_dir, out):
    raise AssertionError("auto trained although a shipped draft fits")


def test_auto_takes_the_shipped_draft_trained_for_the_target(pair, shipped, tmp_path):
    assert shipped_draft(pair[0], shipped) == shipped / "mine"
    fetch("draft", "auto", tmp_path / "d", target_dir=pair[0], train=untrainable, shipped=shipped)
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == (shipped / "mine" / "model.safetensors").read_bytes()
    assert json.loads((tmp_path / "d" / "train_draft.json").read_text()) == json.loads(
        (shipped / "mine" / "train_draft.json").read_text())


def test_auto_trains_when_no_shipped_draft_fits_and_a_named_one_is_refused(pair, shipped, tmp_path):
    only_theirs = tmp_path / "drafts"
    shutil.copytree(shipped / "theirs", only_theirs / "theirs")
    trained = []
    fetch("draft", "auto", tmp_path / "d", target_dir=pair[0], shipped=only_theirs,
          train=lambda t, out: trained.append(t) or shutil.copytree(pair[1], out, dirs_exist_ok=True))
    assert trained == [pair[0]]
    with pytest.raises(CheckpointError, match="was trained for another target than .* retrain it"):
        fetch("draft", str(only_theirs / "theirs"), tmp_path / "named", target_dir=pair[0])
    assert not (tmp_path / "named").exists()


@pytest.mark.parametrize("damage, error", [
    ("model.safetensors", r"draft auto: .*mine/model.safetensors: unreadable safetensors"),
    ("train_draft.json", r"shipped draft card .*mine/train_draft.json is not JSON .*git checkout --"),
])
def test_a_corrupt_shipped_draft_is_one_line_and_nothing_is_written(pair, shipped, tmp_path, damage, error):
    drafts = tmp_path / "drafts"
    shutil.copytree(shipped / "mine", drafts / "mine")
    path = drafts / "mine" / damage
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    with pytest.raises(CheckpointError, match=error):
        fetch("draft", "auto", tmp_path / "d", target_dir=pair[0], train=untrainable, shipped=drafts)
    assert not (tmp_path / "d").exists()


def test_the_fingerprint_is_the_models_not_the_writers(pair, tmp_path):
    """A target converted by another transformers release (a GPU machine's) differs only in config.json's
    `transformers_version`: a draft trained there must still be this target's; any other key makes another target."""
    from dflash_et.checkpoints.load import compute_checkpoint_id

    def variant(name: str, **keys) -> Path:
        copy = shutil.copytree(pair[0], tmp_path / name)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **keys}, indent=4))
        return copy

    same = compute_checkpoint_id(pair[0])
    assert compute_checkpoint_id(variant("writer", transformers_version="5.17.0")) == same
    assert compute_checkpoint_id(variant("model", rms_norm_eps=1e-5)) != same


def test_a_device_that_is_not_one_and_auto_without_a_trainer_are_one_line(pair, tmp_path):
    from dflash_et.training.config import training_device

    with pytest.raises(ValueError, match=r"^train_draft.device='gpu' is not one of auto, cpu, cuda$"):
        training_device(TrainConfig(device="gpu"))
    with pytest.raises(CheckpointError, match=r"^model.draft=auto needs a trainer; run it through the fetch_draft "
                                              r"stage$"):
        fetch("draft", "auto", tmp_path / "d", target_dir=pair[0], shipped=tmp_path / "no-drafts")
    assert not (tmp_path / "d").exists()
