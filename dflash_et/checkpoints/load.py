"""Reading Hugging Face checkpoints into the project's models: configs, weights, fingerprints.

Loading is strict (every parameter present with its shape, nothing extra), so a checkpoint that
does not match its config fails here with a one-line error instead of computing garbage.

(Over 300 lines: twenty short readers of one checkpoint directory (config, generation settings, weight headers,
weights, fingerprint); `load_target` and `load_draft` use nearly all of them, so split by kind every part would
be imported by the same two functions.)
"""

import hashlib
import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from dflash_et import resident
from dflash_et.checkpoints import families, zlab
from dflash_et.errors import CheckpointError
from dflash_et.models.block import ModelArgs
from dflash_et.models.layers import ACTIVATIONS
from dflash_et.models.draft import DFlash2Draft, Draft
from dflash_et.models.target import Target

FINGERPRINT = "fingerprint.json"  # written beside a fetched checkpoint (see checkpoint_id)
# The config.json model.draft: none fetches in place of a draft (the DVC graph keeps its path, and the target's export
# depends on the draft's config.json, which says what to tap): the target then decodes with lookup proposals alone,
# and exports tapping `target_alone_layers` (its program's outputs are the same either way)
NO_DRAFT = {"model.draft": "none"}


def has_draft(draft_dir: Path) -> bool:
    """Whether `draft_dir` holds a draft, not model.draft: none's config.json (one that cannot be read is a draft's,
    for checkpoints.check to refuse in one line)."""
    try:
        return json.loads((draft_dir / "config.json").read_text()) != NO_DRAFT
    except (OSError, ValueError):
        return True


def target_alone_layers(target_dir: Path) -> list[int]:
    """The layer a target exported without a draft taps: z-lab's choice for a one-layer draft, so that target.pte's
    `target` method returns (logits, taps) as every runner reads it, at the cost of one layer's copy."""
    return zlab.default_target_layer_ids(model_args(load_config(target_dir)).num_layers, 1)


def model_args(c: PretrainedConfig, causal: bool | None = True) -> ModelArgs:
    """The stack's shape from a config, through its family (`checkpoints.families`); `layer_types` with
    `sliding_window` give per-layer windows.

    `causal=None` is z-lab's rule for drafts: sliding layers are causal inside the block, full
    layers see the whole block (z-lab's Gemma 4 draft has both kinds)."""
    c = c.get_text_config()
    family = families.family_of(c, "config")
    family.refuse(c)
    layer_types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    act = getattr(c, "hidden_activation", None) or getattr(c, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{c.model_type} config: activation {act!r} is not supported; use one of {sorted(ACTIVATIONS)}")
    return ModelArgs(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        rms_norm_eps=c.rms_norm_eps, mlp_bias=bool(getattr(c, "mlp_bias", False)),
        tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        layers=tuple(family.layer(c, i, kind, causal) for i, kind in enumerate(layer_types[:c.num_hidden_layers])),
        hidden_act=act, logit_softcap=getattr(c, "final_logit_softcapping", None), **family.args(c))


def rope_tables(config: PretrainedConfig, max_seq_len: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin for positions 0..max_seq_len-1 from transformers' own RoPE code (llama3, yarn, Gemma 4's
    proportional, Qwen3.5's partial rotary, ...), as the config's family makes them: one table, or for
    Gemma 4 one per layer type (their head dims and thetas differ)."""
    c = config.get_text_config()
    return families.family_of(c, "config").rope(c, max_seq_len)


def weight_files(ckpt: Path) -> list[Path]:
    """The safetensors files of a checkpoint, sharded (with an index) or not."""
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt / s for s in shards]
    return sorted(ckpt.glob("*.safetensors"))


def compute_checkpoint_id(ckpt: Path) -> int:
    """A fingerprint of a checkpoint's config and weights (reads every byte: ~20 s for 8 GB). The config counts
    without `transformers_version`, which says who wrote it, not what the model is: a target converted from the
    same GGUF by another transformers release (a GPU machine's) is the same target to a shipped draft's card."""
    h = hashlib.blake2b(digest_size=8)
    config = json.loads((ckpt / "config.json").read_text())
    config.pop("transformers_version", None)
    h.update(json.dumps(config, sort_keys=True).encode())
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


def header_shapes(ckpt: Path, name: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor, from the safetensors headers alone (no weights read)."""
    files = weight_files(ckpt)
    if not files:
        raise CheckpointError(f"{name}: no .safetensors weights")
    shapes = {}
    for f in files:
        if not f.exists():
            raise CheckpointError(f"{name}: shard {f.name} listed in the index is missing")
        try:
            with safe_open(f, "pt") as st:
                shapes |= {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
        except SafetensorError as e:
            raise CheckpointError(f"{name}/{f.name}: unreadable safetensors ({e}); the file is truncated or corrupt, fetch it again") from None
    return shapes


def eos_ids(target_dir: Path) -> list[int]:
    """EOS ids from generation_config.json (falling back to config.json), as a list."""
    eos = _generation_value(target_dir, "eos_token_id")
    return [] if eos is None else sorted(set(eos if isinstance(eos, list) else [eos]))


def bos_id(target_dir: Path) -> int | None:
    """The BOS id, where the checkpoint has one (ExecuTorch's runners prepend it when asked to)."""
    bos = _generation_value(target_dir, "bos_token_id")
    return bos[0] if isinstance(bos, list) else bos


def _generation_value(target_dir: Path, key: str):
    for name in ("generation_config.json", "config.json"):
        f = target_dir / name
        if f.exists():
            value = json.loads(f.read_text()).get(key)
            if value is not None:
                return value
    return None


# transformers' `generate` defaults for what a sampling generation_config.json leaves unset
GENERATE_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def recommended_sampling(target_dir: Path) -> dict:
    """The checkpoint's recommended sampling, from generation_config.json: what `generate` would sample with.

    Greedy checkpoints (`do_sample` false or unset, or no generation_config.json) recommend temperature
    0; unset values take `generate`'s defaults, so `--sample` samples as `model.generate()` on the
    checkpoint would, as far as temperature, top-k and top-p go (min_p, typical_p and repetition
    penalties are not applied). top_k 0 means none.
    """
    from transformers import GenerationConfig

    config = (GenerationConfig.from_pretrained(target_dir) if (target_dir / "generation_config.json").exists()
              else GenerationConfig())
    if not config.do_sample:
        return {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    value = {k: GENERATE_DEFAULTS[k] if getattr(config, k) is None else getattr(config, k) for k in GENERATE_DEFAULTS}
    return {"temperature": float(value["temperature"]), "top_p": float(value["top_p"]), "top_k": int(value["top_k"])}


def load_config(ckpt: Path) -> PretrainedConfig:
    raw = json.loads((ckpt / "config.json").read_text())
    family = families.claiming(raw.get("model_type"))
    if family is not None:
        family.refuse_json(raw, f"{ckpt}/config.json")
    return AutoConfig.from_pretrained(ckpt)


def build_target(config: PretrainedConfig, layer_ids: list[int], max_seq_len: int, ops: str = "torch",
                 empty: bool = False, max_call: int | None = None, verify_call: int | None = None,
                 ring: bool = False) -> Target:
    """The target's modules; `empty`: parameters and caches on the meta device (no memory) until loaded;
    `max_call`: the longest call (None: any), with `ring` sliding layers keep ring buffers for such calls;
    `verify_call`: the longest call that may be kept in part (a verify; see models.deltanet)."""
    families.family_of(config)  # refuses a model_type no family claims
    rope = rope_tables(config, max_seq_len)
    with torch.device("meta") if empty else nullcontext():
        return Target(model_args(config), rope, layer_ids, ops, max_call, verify_call, ring)


def build_draft(draft_config: PretrainedConfig, target: ModelArgs, max_seq_len: int, ops: str = "torch",
                empty: bool = False, max_block: int | None = None, ring: bool = False) -> Draft:
    """The draft's modules; its vocabulary and embedding width are the target's, whose head it borrows. A
    `context_window` (zlab.DraftSettings) narrows every layer's own window to it; `max_block` and `ring` as
    models.draft.Draft takes them."""
    settings = zlab.draft_settings(draft_config)
    embed_scale = settings.embed_scale if settings.embed_scale is not None else \
        target.embed_scale * settings.input_embedding_scale
    args = replace(model_args(draft_config, causal=settings.causal), vocab_size=target.vocab_size,
                   embed_scale=embed_scale, logit_softcap=settings.logit_softcap)
    if settings.context_window is not None:
        w = settings.context_window
        args = replace(args, layers=tuple(replace(s, window=min(s.window or w, w)) for s in args.layers))
    rope = rope_tables(draft_config, max_seq_len)
    with torch.device("meta") if empty else nullcontext():
        dflash2 = () if settings.selector is None else (settings.conv, settings.selector)
        return (DFlash2Draft if dflash2 else Draft)(args, rope, len(settings.target_layer_ids), target.hidden_size,
                                                    settings.logit_scale, ops, max_block, ring, *dflash2)


MULTIMODAL_PREFIX = "model.language_model."  # Gemma 4's and Qwen3.5's wrappers: the text model (vision ignored)


def target_state_dict(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names (`model.layers.0...`, or the multimodal wrapper's `model.language_model.layers.0...`) to
    ours (`layers.0...`); rotary buffers some old checkpoints carry and Qwen3.5's multi-token-prediction
    head (`mtp.*`, which DFlash does not use) are dropped."""
    if any(k.startswith(MULTIMODAL_PREFIX) for k in weights):
        return {k.removeprefix(MULTIMODAL_PREFIX): v for k, v in weights.items()
                if k.startswith(MULTIMODAL_PREFIX) or k == "lm_head.weight"}
    return {k.removeprefix("model."): v for k, v in weights.items() if "rotary_emb" not in k and not k.startswith("mtp.")}


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


FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # what a weight may be stored as


def _floating(tensor: torch.Tensor, where: str) -> torch.Tensor:
    """A weight as stored, refused if it is not plain floating point (a pre-quantized checkpoint's int/fp8 data
    would be cast to garbage). In the export dtype already, it stays the checkpoint's mapping: never read
    into memory unless used (export.frugal writes it to the program from the file)."""
    if tensor.dtype not in FLOATS:
        raise CheckpointError(f"{where} is stored as {tensor.dtype}, which is not supported; use a checkpoint in "
                              "bf16, fp16 or fp32 (dequantize a pre-quantized one; export.quantize quantizes it)")
    return tensor


def _fill(model: nn.Module, ckpt: Path, name: str, rename: Callable[[dict], dict], dtype: torch.dtype,
          optional: tuple[str, ...] = (), prepare: Callable[[nn.Module], None] | None = None,
          only: tuple[str, ...] | None = None, convert: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None
          ) -> None:
    """Load an `empty` model's weights in `dtype`, a tensor at a time, so the peak is the model in `dtype` plus one
    weight, never a float32 copy of it all nor of a shard. `prepare` (quantization) runs on each module of a decoder
    layer as soon as its own weights are in (a Linear once its weight is), so a quantized export never holds more
    than one of them unquantized.
    `convert` converts the weights outside the decoder layers (the embedding, the head: export converts them a
    block at a time into its spool), `Tensor.to` the rest. The pages of the checkpoint that converting read are
    dropped (resident.drop): its mapping is not unmapped before the shard is done.
    `only`: load just these parameters (the rest stay on the meta device, taking no memory)."""
    check_weights(name, model, rename(header_shapes(ckpt, name)), optional)
    prepared = set()
    for f in weight_files(ckpt):
        with safe_open(f, "pt") as st:
            keys = {ours: theirs for ours, theirs in rename({k: k for k in st.keys()}).items()
                    if only is None or ours in only}
            for ours, theirs in keys.items():
                stored = _floating(st.get_tensor(theirs), f"{name}/{f.name}: {theirs}")
                in_layer = ours.startswith("layers.")
                weight = stored.to(dtype) if convert is None or in_layer else convert(stored, dtype)
                if weight is not stored:
                    resident.drop(stored)
                model.load_state_dict({ours: weight}, strict=False, assign=True)
                owner = ours.rpartition(".")[0]
                module = model.get_submodule(owner)
                if (prepare is not None and in_layer and owner not in prepared
                        and not any(p.is_meta for p in module.parameters(recurse=False))):
                    prepare(module)
                    prepared.add(owner)
    for module in model.modules():  # the KV caches and DeltaNet states: zeros, allocated once, in dtype
        for key, buf in module._buffers.items():
            if buf is not None and buf.is_meta and only is None:
                floating = getattr(module, "state_dtype", dtype)
                module._buffers[key] = torch.zeros(buf.shape, dtype=floating if buf.is_floating_point() else buf.dtype)
    model.rope.to(dtype)  # the RoPE tables (parameters may be quantized by now: left alone)


def load_target(target_dir: Path, layer_ids: list[int], max_seq_len: int, ops: str = "torch",
                dtype: torch.dtype = torch.float32, prepare: Callable[[nn.Module], None] | None = None, *,
                only: tuple[str, ...] | None = None, max_call: int | None = None, verify_call: int | None = None,
                ring: bool = False, convert: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None) -> Target:
    """The target in `dtype`, with weights from its safetensors (sharded or not); `only` and `convert` as in `_fill`
    (exporting the draft needs just the target's embedding and head); `max_call`, `verify_call`, `ring`
    as in build_target."""
    model = build_target(load_config(target_dir), layer_ids, max_seq_len, ops, empty=True, max_call=max_call,
                         verify_call=verify_call, ring=ring)
    optional = ("lm_head.weight",) if model.args.tie_word_embeddings else ()
    _fill(model, target_dir, f"target {target_dir}", target_state_dict, dtype, optional, prepare, only, convert)
    model.tie_weights()
    return model.eval()


def load_draft(draft_dir: Path, target: Target, ops: str = "torch", dtype: torch.dtype = torch.float32,
               prepare: Callable[[nn.Module], None] | None = None, max_block: int | None = None,
               ring: bool = False) -> Draft:
    """The draft in `dtype`: every z-lab key used, none missing; embedding and head from `target`; `max_block`
    and `ring` as build_draft takes them."""
    model = build_draft(load_config(draft_dir), target.args, target.max_seq_len, ops, empty=True, max_block=max_block,
                        ring=ring)
    zlab.borrow(model, target)
    _fill(model, draft_dir, f"draft {draft_dir}", zlab.draft_weight_names, dtype, zlab.BORROWED, prepare)
    return model.eval()
