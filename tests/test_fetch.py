"""Fetching checkpoints: local directories, the hub through the real snapshot_download, and every refusal."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from dflash_et.checkpoints.fetch import fetch
from dflash_et.errors import CheckpointError
from tests import REPO


def copy(src: Path, dst: Path, **config_changes) -> Path:
    shutil.copytree(src, dst)
    if config_changes:
        config = json.loads((dst / "config.json").read_text())
        for key, value in config_changes.items():
            node, *path = key.split(".")
            target = config
            for part in [node, *path][:-1]:
                target = target[part]
            target[[node, *path][-1]] = value
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def assert_refused(match: str, role: str, source, out: Path, target_dir=None) -> str:
    with pytest.raises(CheckpointError, match=match) as e:
        fetch(role, str(source), out, target_dir=target_dir)
    assert not out.exists(), "a refused fetch must leave no output"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp dir left behind"
    assert "\n" not in str(e.value)
    return str(e.value)


def test_local_dirs_are_copied_and_checked(pair, tmp_path):
    target, draft = pair
    (target.parent / "notes.txt").write_text("not a checkpoint file")
    fetch("target", str(target), tmp_path / "t")
    fetch("draft", str(draft), tmp_path / "d", target_dir=tmp_path / "t")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(p.name for p in target.iterdir())
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == (draft / "model.safetensors").read_bytes()


def test_refetch_replaces_previous_output(pair, tmp_path):
    out = tmp_path / "t"
    fetch("target", str(pair[0]), out)
    (out / "stale.txt").write_text("x")
    fetch("target", str(pair[0]), out)
    assert not (out / "stale.txt").exists()


def hub_cache(root: Path, repo_id: str, src: Path, sha: str = "a" * 40) -> None:
    """A Hugging Face cache holding one snapshot of `repo_id`, as snapshot_download leaves it."""
    repo = root / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    shutil.copytree(src, repo / "snapshots" / sha)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """Point huggingface_hub at a private cache and an endpoint nobody listens on."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hf"


def test_hub_fetch_uses_snapshot_download_cache(pair, hub, tmp_path):
    hub_cache(hub, "z-lab/tiny-target", pair[0])
    fetch("target", "z-lab/tiny-target", tmp_path / "t")
    assert (tmp_path / "t" / "model.safetensors").read_bytes() == (pair[0] / "model.safetensors").read_bytes()


def test_hub_fetch_pinned_revision(pair, hub, tmp_path):
    sha = "b" * 40
    hub_cache(hub, "z-lab/tiny-target", pair[0], sha=sha)
    fetch("target", f"z-lab/tiny-target@{sha}", tmp_path / "t")
    assert (tmp_path / "t" / "config.json").exists()
    msg = assert_refused("cannot download", "target", f"z-lab/tiny-target@{'c' * 40}", tmp_path / "u")
    assert "model.target" in msg


def test_offline_hub_error_names_param_and_alternatives(hub, tmp_path):
    msg = assert_refused("model.target: cannot download 'Qwen/Qwen3-4B'", "target", "Qwen/Qwen3-4B", tmp_path / "t")
    assert "local checkpoint directory" in msg and "'builtin'" in msg


def test_unreachable_hub_error(hub, monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    msg = assert_refused("model.draft: cannot download", "draft", "z-lab/Qwen3-4B-DFlash-b16", tmp_path / "d")
    assert "'builtin'" in msg


def test_unknown_source(tmp_path):
    assert_refused("neither 'builtin', 'builtin-gemma', 'builtin-hybrid', 'smollm2', an existing directory, a .gguf file, nor a hub id", "target", "not a model!",
                   tmp_path / "t")
    assert_refused("neither 'builtin', 'auto', 'train', 'none', an existing directory, nor a hub id", "draft",
                   "builtin-gemma", tmp_path / "d")
    assert_refused("is not a directory", "target", tmp_path / "missing", tmp_path / "t")


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text("hello")
    assert_refused("no config.json", "target", tmp_path / "src", tmp_path / "t")


def test_missing_or_truncated_weights(pair, tmp_path):
    src = copy(pair[0], tmp_path / "src")
    (src / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:100_000])
    assert_refused("truncated or corrupt", "target", src, tmp_path / "t")
    (src / "model.safetensors").unlink()
    assert_refused("no .safetensors weights", "target", src, tmp_path / "t")


def test_weights_that_do_not_match_config(pair, tmp_path):
    src = copy(pair[0], tmp_path / "src", intermediate_size=512)
    assert_refused("weights do not match its config.json .*wrong shape: layers.0.mlp.down_proj", "target", src, tmp_path / "t")


def test_unsupported_target_architecture(pair, tmp_path):
    src = copy(pair[0], tmp_path / "src", model_type="gpt2")
    assert_refused("gpt2", "target", src, tmp_path / "t")


@pytest.mark.parametrize("changes, message", [
    ({"dflash_config.target_layer_ids": [1]}, r"fc.weight input 512 != 1 target_layer_ids x target hidden_size 256"),
    ({"dflash_config.target_layer_ids": [1, 9]}, r"target_layer_ids \[9\] outside the target's 6 layers"),
    ({"dflash_config.mask_token_id": 5000}, r"mask_token_id 5000 outside the target vocab_size 2048"),
    ({"hidden_size": 128}, r"draft hidden_size 128 != target hidden_size 256"),
    ({"num_target_layers": 36}, r"num_target_layers 36 != target num_hidden_layers 6"),
    ({"num_attention_heads": 4}, r"wrong shape: layers.0.self_attn.o_proj.weight"),
    ({"architectures": ["Qwen3ForCausalLM"]}, r"architectures is not \['DFlashDraftModel'\]"),
])
def test_draft_that_does_not_fit_its_target(pair, tmp_path, changes, message):
    target, draft = pair
    src = copy(draft, tmp_path / "src", **changes)
    msg = assert_refused(message, "draft", src, tmp_path / "d", target_dir=target)
    if " does not fit target " in msg:
        assert str(src) in msg and str(target) in msg


def test_stage_prints_one_line_and_fails(tmp_path):
    (tmp_path / "params.yaml").write_text("block_size: 16\nmodel: {target: /nonexistent/ckpt, draft: builtin}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "stages.fetch", "artifacts/weights/target"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "error: model.target: /nonexistent/ckpt is not a directory; give a checkpoint directory, a hub id or 'builtin'")
    assert not (tmp_path / "artifacts" / "weights" / "target").exists()


def test_sharded_checkpoint_with_a_missing_shard(pair, tmp_path):
    from tests.tiny_checkpoints import random_checkpoint

    src = random_checkpoint(tmp_path / "src", "llama", shard=True)
    shutil.copy(pair[0] / "tokenizer.json", src)
    shards = sorted(src.glob("model-*.safetensors"))
    shards[-1].unlink()
    assert_refused(f"shard {shards[-1].name} listed in the index is missing", "target", src, tmp_path / "t")


def test_target_without_tokenizer(pair, tmp_path):
    src = copy(pair[0], tmp_path / "src")
    (src / "tokenizer.json").unlink()
    assert_refused("no tokenizer.json or tokenizer.model", "target", src, tmp_path / "t")


def test_unreadable_config(pair, tmp_path):
    src = copy(pair[0], tmp_path / "src")
    (src / "config.json").write_text("{not json")
    assert_refused("config.json: cannot be read as a model config", "target", src, tmp_path / "t")


def test_draft_without_mask_token(pair, tmp_path):
    src = copy(pair[1], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    del config["dflash_config"]["mask_token_id"]
    (src / "config.json").write_text(json.dumps(config))
    assert_refused("no dflash_config.mask_token_id: not a DFlash draft checkpoint", "draft", src, tmp_path / "d",
                   target_dir=pair[0])
