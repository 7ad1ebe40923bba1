"""Export-friendly target and DFlash draft models, loaded from Hugging Face / z-lab checkpoints.

Both models keep their KV caches in buffers and use ExecuTorch's LLM custom ops
(`llama::update_cache`, `llama::custom_sdpa`): the same code runs eagerly (the ops have CPU
kernels) and lowers to XNNPACK without copying the whole cache every call, which the plain
`index_put` pattern does.

Target: `forward(tokens [1,T], input_pos [T]) -> (logits [1,T,V], taps [1,T,k*H])`. A call
writes K/V at `input_pos` and attends causally to everything before; rolling back is just
calling again at an earlier position, since attention never looks past the current call.

Draft: `forward(tokens [1,B], hidden [1,n,k*H], input_pos [n]) -> logits [1,B-1,V]`. The n new
context taps are written to the draft's own cache (it persists across rounds); the block's
K/V are written right after them and attended without a causal mask. The next call's context
overwrites those block entries. Positions in `input_pos` must be consecutive.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers torch.ops.llama.*)

SUPPORTED_TARGETS = ("qwen3", "llama")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with a message that says why and what to do."""


@dataclass(frozen=True)
class ModelArgs:
    """The shape of one transformer stack, read from a Hugging Face config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, c: PretrainedConfig) -> "ModelArgs":
        return cls(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
            num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            rms_norm_eps=c.rms_norm_eps, qk_norm=c.model_type == "qwen3",
            attention_bias=bool(getattr(c, "attention_bias", False)),
            mlp_bias=bool(getattr(c, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        )


def rope_table(config: PretrainedConfig, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..max_seq_len-1, using transformers' own RoPE variants (llama3, yarn, ...)."""
    rope = LlamaRotaryEmbedding(config)
    freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), rope.inv_freq.float())
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * rope.attention_scaling, emb.sin() * rope.attention_scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [1, T, heads, D] by per-position cos/sin [T, D] (HF's rotate_half convention)."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=a.mlp_bias)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=a.mlp_bias)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=a.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Attention over a static KV cache: queries are the last T of the K/V rows written this call."""

    def __init__(self, a: ModelArgs, max_seq_len: int):
        super().__init__()
        self.a = a
        self.q_proj = nn.Linear(a.hidden_size, a.num_heads * a.head_dim, bias=a.attention_bias)
        self.k_proj = nn.Linear(a.hidden_size, a.num_kv_heads * a.head_dim, bias=a.attention_bias)
        self.v_proj = nn.Linear(a.hidden_size, a.num_kv_heads * a.head_dim, bias=a.attention_bias)
        self.o_proj = nn.Linear(a.num_heads * a.head_dim, a.hidden_size, bias=a.attention_bias)
        if a.qk_norm:
            self.q_norm = RMSNorm(a.head_dim, a.rms_norm_eps)
            self.k_norm = RMSNorm(a.head_dim, a.rms_norm_eps)
        self.mlx = False
        cache_shape = (1, max_seq_len, a.num_kv_heads, a.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape), persistent=False)

    def use_mlx_ops(self) -> None:
        """Switch to the MLX delegate's cache ops (`mlx::kv_cache_update`, `mlx::custom_sdpa`): same
        semantics as the llama ops, but heads-first caches [1, kv_heads, S, D]."""
        from dflash_et.mlx_backend import ensure_mlx_backend

        ensure_mlx_backend()  # registers torch.ops.mlx.*
        self.mlx = True
        self.k_cache = self.k_cache.transpose(1, 2).contiguous()
        self.v_cache = self.v_cache.transpose(1, 2).contiguous()

    def forward(self, x: torch.Tensor, kv_in: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                start: int, is_causal: bool) -> torch.Tensor:
        a, t, s = self.a, x.shape[1], kv_in.shape[1]
        q = self.q_proj(x).view(1, t, a.num_heads, a.head_dim)
        k = self.k_proj(kv_in).view(1, s, a.num_kv_heads, a.head_dim)
        v = self.v_proj(kv_in).view(1, s, a.num_kv_heads, a.head_dim)
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q_start = s - t
        q = apply_rope(q, cos[q_start:s], sin[q_start:s])  # explicit ends: the MLX partitioner rejects open slices
        k = apply_rope(k, cos, sin)
        if self.mlx:
            torch.ops.mlx.kv_cache_update(self.k_cache, k.transpose(1, 2), start)
            torch.ops.mlx.kv_cache_update(self.v_cache, v.transpose(1, 2), start)
            y = torch.ops.mlx.custom_sdpa(q.transpose(1, 2), self.k_cache, self.v_cache, start + q_start,
                                          None, 0.0, is_causal).transpose(1, 2)
        else:
            torch.ops.llama.update_cache(k, self.k_cache, start)
            torch.ops.llama.update_cache(v, self.v_cache, start)
            y = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, start + q_start, None, 0, is_causal)
        return self.o_proj(y.reshape(1, t, a.num_heads * a.head_dim))


class Block(nn.Module):
    """A pre-norm decoder layer. With `ctx` (a draft layer), K/V also cover the un-normed context."""

    def __init__(self, a: ModelArgs, max_seq_len: int):
        super().__init__()
        self.self_attn = Attention(a, max_seq_len)
        self.mlp = MLP(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                ctx: torch.Tensor | None = None) -> torch.Tensor:
        h = self.input_layernorm(x)
        kv_in = h if ctx is None else torch.cat([ctx, h], dim=1)
        x = x + self.self_attn(h, kv_in, cos, sin, start, is_causal=ctx is None)
        return x + self.mlp(self.post_attention_layernorm(x))


def _start_position(input_pos: torch.Tensor, length: int, max_seq_len: int) -> int:
    """First position of a call, with the bounds the exporter needs to reason about it."""
    start = input_pos[0].item()
    torch._check(start >= 0)
    torch._check(start + length <= max_seq_len)
    return start


class Target(nn.Module):
    """A Qwen3/Llama causal LM that also returns the hidden states DFlash's draft reads."""

    def __init__(self, a: ModelArgs, rope: tuple[torch.Tensor, torch.Tensor], layer_ids: list[int]):
        super().__init__()
        self.args, self.layer_ids, self.max_seq_len = a, list(layer_ids), rope[0].shape[0]
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(Block(a, self.max_seq_len) for _ in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        if a.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("rope_cos", rope[0], persistent=False)
        self.register_buffer("rope_sin", rope[1], persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = _start_position(input_pos, tokens.shape[1], self.max_seq_len)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        x = self.embed_tokens(tokens)
        taps = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, start)
            taps[i] = x
        x = self.norm(x)
        # transformers' hidden_states[L] (the last layer's output) is taken after the final norm.
        taps[len(self.layers) - 1] = x
        return self.lm_head(x), torch.cat([taps[i] for i in self.layer_ids], dim=-1)


class Draft(nn.Module):
    """z-lab's DFlash draft with a persistent context cache and the target's embedding and head."""

    def __init__(self, a: ModelArgs, rope: tuple[torch.Tensor, torch.Tensor], num_taps: int, target_hidden: int,
                 embed_scale: float = 1.0, logit_scale: float = 1.0):
        super().__init__()
        self.args, self.max_seq_len = a, rope[0].shape[0]
        self.embed_scale, self.logit_scale = embed_scale, logit_scale
        self.embed_tokens = nn.Embedding(a.vocab_size, target_hidden)
        self.lm_head = nn.Linear(target_hidden, a.vocab_size, bias=False)
        self.fc = nn.Linear(num_taps * target_hidden, a.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.layers = nn.ModuleList(Block(a, self.max_seq_len) for _ in range(a.num_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.register_buffer("rope_cos", rope[0], persistent=False)
        self.register_buffer("rope_sin", rope[1], persistent=False)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        n, b = hidden.shape[1], tokens.shape[1]
        start = _start_position(input_pos, n + b, self.max_seq_len)
        positions = torch.arange(n + b, dtype=torch.long) + start
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        ctx = self.hidden_norm(self.fc(hidden))
        x = self.embed_tokens(tokens) * self.embed_scale
        for layer in self.layers:
            x = layer(x, cos, sin, start, ctx)
        return self.lm_head(self.norm(x[:, 1:b])) * self.logit_scale  # explicit end, as in Attention


# --- checkpoints ---------------------------------------------------------------------------

DRAFT_BORROWED = ("embed_tokens.weight", "lm_head.weight")


def weight_files(ckpt: Path) -> list[Path]:
    """The safetensors files of a checkpoint, sharded (with an index) or not."""
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt / s for s in shards]
    return sorted(ckpt.glob("*.safetensors"))


def checkpoint_id(ckpt: Path) -> int:
    """A fingerprint of a checkpoint's config and weights, stored in the programs and in a trained
    draft's train_draft.json to catch mixed-up files."""
    h = hashlib.blake2b(digest_size=8)
    h.update((ckpt / "config.json").read_bytes())
    for f in weight_files(ckpt):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return int.from_bytes(h.digest(), "little") >> 2  # fits an int64 constant method


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for f in weight_files(ckpt):
        weights |= load_file(f)
    return weights


@dataclass(frozen=True)
class DraftSettings:
    """What the draft's config says about how the pair is driven."""

    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int


def draft_settings(draft_config: PretrainedConfig) -> DraftSettings:
    from dflash_et.builtin import default_target_layer_ids

    dflash = getattr(draft_config, "dflash_config", None) or {}
    layer_ids = dflash.get("target_layer_ids") or getattr(draft_config, "target_layer_ids", None)
    if layer_ids is None:
        layer_ids = default_target_layer_ids(draft_config.num_target_layers, draft_config.num_hidden_layers)
    mask = dflash.get("mask_token_id", getattr(draft_config, "mask_token_id", None))
    if mask is None:
        raise CheckpointError("draft config has no dflash_config.mask_token_id: not a DFlash draft checkpoint")
    return DraftSettings(list(layer_ids), int(mask), int(getattr(draft_config, "block_size", 16)))


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


def build_target(config: PretrainedConfig, layer_ids: list[int], max_seq_len: int) -> Target:
    if config.model_type not in SUPPORTED_TARGETS:
        raise CheckpointError(f"target model_type {config.model_type!r} is not supported; use one of {SUPPORTED_TARGETS}")
    return Target(ModelArgs.from_config(config), rope_table(config, max_seq_len), layer_ids)


def build_draft(draft_config: PretrainedConfig, target: ModelArgs, max_seq_len: int) -> Draft:
    """The draft's modules; its vocabulary and embedding width are the target's, whose head it borrows."""
    settings = draft_settings(draft_config)
    args = ModelArgs(**{**ModelArgs.from_config(draft_config).__dict__, "vocab_size": target.vocab_size})
    dflash = getattr(draft_config, "dflash_config", None) or {}
    return Draft(args, rope_table(draft_config, max_seq_len), len(settings.target_layer_ids),
                 target.hidden_size, float(dflash.get("input_embedding_scale", 1.0)),
                 float(dflash.get("output_multiplier", 1.0)))


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


def load_target(target_dir: Path, layer_ids: list[int], max_seq_len: int) -> Target:
    """The target in float32, with weights from its safetensors (sharded or not)."""
    model = build_target(load_config(target_dir), layer_ids, max_seq_len)
    optional = ("lm_head.weight",) if model.args.tie_word_embeddings else ()
    _load_strict(model, target_state_dict(read_weights(target_dir)), f"target {target_dir}", optional)
    return model.eval()


def load_draft(draft_dir: Path, target: Target) -> Draft:
    """The draft in float32: every z-lab key used, none missing; embedding and head from `target`."""
    model = build_draft(load_config(draft_dir), target.args, target.max_seq_len)
    _load_strict(model, read_weights(draft_dir), f"draft {draft_dir}", optional=DRAFT_BORROWED)
    model.embed_tokens.weight = target.embed_tokens.weight
    model.lm_head.weight = target.lm_head.weight
    return model.eval()
