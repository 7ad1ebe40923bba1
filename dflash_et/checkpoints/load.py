"""Reading Hugging Face checkpoints into the project's models: configs, weights, fingerprints.

Loading is strict (every parameter present with its shape, nothing extra), so a checkpoint that
does not match its config fails here with a one-line error instead of computing garbage.
"""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from dflash_et.checkpoints import zlab
from dflash_et.errors import CheckpointError
from dflash_et.models.attention import AttentionSpec
from dflash_et.models.block import ModelArgs
from dflash_et.models.draft import Draft
from dflash_et.models.target import Target

SUPPORTED_TARGETS = ("qwen3", "llama")
FINGERPRINT = "fingerprint.json"  # written beside a fetched checkpoint (see checkpoint_id)


def model_args(c: PretrainedConfig, causal: bool = True) -> ModelArgs:
    """The stack's shape from a config; `layer_types` with `sliding_window` give per-layer windows."""
    layer_types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    window = getattr(c, "sliding_window", None)

    def spec(kind: str) -> AttentionSpec:
        return AttentionSpec(
            num_heads=c.num_attention_heads,
            num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            qk_norm=c.model_type == "qwen3", bias=bool(getattr(c, "attention_bias", False)), causal=causal,
            window=window if kind == "sliding_attention" else None)

    return ModelArgs(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        rms_norm_eps=c.rms_norm_eps, mlp_bias=bool(getattr(c, "mlp_bias", False)),
        tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        layers=tuple(spec(kind) for kind in layer_types[:c.num_hidden_layers]))


def rope_table(config: PretrainedConfig, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..max_seq_len-1, using transformers' own RoPE variants (llama3, yarn, ...)."""
    rope = LlamaRotaryEmbedding(config)
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), rope.inv_freq.float())
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * rope.attention_scaling, emb.sin() * rope.attention_scaling


def weight_files(ckpt: Path) -> list[Path]:
    """The safetensors files of a checkpoint, sharded (with an index) or not."""
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt / s for s in shards]
    return sorted(ckpt.glob("*.safetensors"))


def compute_checkpoint_id(ckpt: Path) -> int:
    """A fingerprint of a checkpoint's config and weights (reads every byte: ~20 s for 8 GB)."""
    h = hashlib.blake2b(digest_size=8)
    h.update((ckpt / "config.json").read_bytes())
    for f in weight_files(ckpt):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return int.from_bytes(h.digest(), "little") >> 2  # fits an int64 constant method


def write_checkpoint_id(ckpt: Path) -> int:
    """Compute the fingerprint once, when the checkpoint is fetched, and store it beside the weights."""
    value = compute_checkpoint_id(ckpt)
    (ckpt / FINGERPRINT).write_text(json.dumps({"checkpoint_id": value}) + "\n")
    return value


def checkpoint_id(ckpt: Path) -> int:
    """The fingerprint stored beside a fetched checkpoint, or computed for one that was not fetched.

    It goes into the programs and a trained draft's train_draft.json to catch mixed-up files.
    """
    stored = ckpt / FINGERPRINT
    if stored.is_file():
        return int(json.loads(stored.read_text())["checkpoint_id"])
    return compute_checkpoint_id(ckpt)


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for f in weight_files(ckpt):
        weights |= load_file(f)
    return weights


def eos_ids(target_dir: Path) -> list[int]:
    """EOS ids from generation_config.json (falling back to config.json), as a list."""
    for name in ("generation_config.json", "config.json"):
        f = target_dir / name
        if f.exists():
            eos = json.loads(f.read_text()).get("eos_token_id")
            if eos is not None:
                return sorted(set(eos if isinstance(eos, list) else [eos]))
    return []


def load_config(ckpt: Path) -> PretrainedConfig:
    return AutoConfig.from_pretrained(ckpt)


def build_target(config: PretrainedConfig, layer_ids: list[int], max_seq_len: int, cache: str = "dense") -> Target:
    if config.model_type not in SUPPORTED_TARGETS:
        raise CheckpointError(f"target model_type {config.model_type!r} is not supported; use one of {SUPPORTED_TARGETS}")
    return Target(model_args(config), rope_table(config, max_seq_len), layer_ids, cache)


def build_draft(draft_config: PretrainedConfig, target: ModelArgs, max_seq_len: int, cache: str = "dense") -> Draft:
    """The draft's modules; its vocabulary and embedding width are the target's, whose head it borrows."""
    settings = zlab.draft_settings(draft_config)
    args = replace(model_args(draft_config, causal=False), vocab_size=target.vocab_size)
    return Draft(args, rope_table(draft_config, max_seq_len), len(settings.target_layer_ids), target.hidden_size,
                 settings.embed_scale, settings.logit_scale, cache)


def target_state_dict(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names (`model.layers.0...`) to ours (`layers.0...`); rotary buffers some old checkpoints carry are dropped."""
    return {k.removeprefix("model."): v for k, v in weights.items() if "rotary_emb" not in k}


def check_weights(name: str, module: nn.Module, actual: dict[str, tuple[int, ...]], optional: tuple[str, ...] = ()) -> None:
    """Every parameter of `module` present with its shape, nothing extra (keys in `optional` may be absent)."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(expected) - set(actual) - set(optional))
    unexpected = sorted(set(actual) - set(expected))
    wrong = [f"{k} {list(actual[k])} != {list(expected[k])}" for k in sorted(set(expected) & set(actual))
             if expected[k] != actual[k]]
    problems = [f"{label}: {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}"
                for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)) if items]
    if problems:
        raise CheckpointError(f"{name}: weights do not match its config.json ({'; '.join(problems)})")


def _load_strict(module: nn.Module, state: dict[str, torch.Tensor], name: str, optional: tuple[str, ...] = ()) -> None:
    check_weights(name, module, {k: tuple(v.shape) for k, v in state.items()}, optional)
    dtypes = {k: v.dtype for k, v in module.state_dict().items()}
    module.load_state_dict({k: v.to(dtypes[k]) for k, v in state.items()}, strict=False)


def load_target(target_dir: Path, layer_ids: list[int], max_seq_len: int, cache: str = "dense") -> Target:
    """The target in float32, with weights from its safetensors (sharded or not)."""
    model = build_target(load_config(target_dir), layer_ids, max_seq_len, cache)
    optional = ("lm_head.weight",) if model.args.tie_word_embeddings else ()
    _load_strict(model, target_state_dict(read_weights(target_dir)), f"target {target_dir}", optional)
    return model.eval()


def load_draft(draft_dir: Path, target: Target, cache: str = "dense") -> Draft:
    """The draft in float32: every z-lab key used, none missing; embedding and head from `target`."""
    model = build_draft(load_config(draft_dir), target.args, target.max_seq_len, cache)
    _load_strict(model, read_weights(draft_dir), f"draft {draft_dir}", optional=zlab.BORROWED)
    zlab.borrow(model, target)
    return model.eval()
