"""z-lab's DFlash draft checkpoint layout: its config, tap layers, mask token, initial weights.

A draft checkpoint is `config.json` (`architectures: [DFlashDraftModel]`, a `dflash_config` with
`mask_token_id` and `target_layer_ids`) and `model.safetensors` without the embedding and head,
which the draft borrows from its target at load time.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoTokenizer, PretrainedConfig

from dflash_et.checkpoints import families
from dflash_et.errors import CheckpointError

BORROWED = ("embed_tokens.weight", "lm_head.weight")  # the target's, never stored in a draft checkpoint
MASK_NAMES = ("<|mask|>", "<|MASK|>", "<mask>", "[MASK]")
BLOCK_SIZE = 16  # z-lab's block, for a config that names none (and the programs of a target without a draft)


@dataclass(frozen=True)
class DraftSettings:
    """What the draft's config says about how the pair is driven."""

    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int
    # The block's embedding is the target's embedding times `embed_scale`; unset, the target's own
    # scale (sqrt(hidden) for Gemma) times `input_embedding_scale`, as z-lab's Gemma 4 integrations
    # (MLX, SGLang, its vLLM patch) embed it. dflash 0.1.0's torch model skips the target's scale.
    embed_scale: float | None = None
    input_embedding_scale: float = 1.0
    logit_scale: float = 1.0
    logit_softcap: float | None = None
    causal: bool | None = None  # None: sliding layers causal, full layers not (z-lab's rule)
    # Every layer attends to at most this many positions back (the block's own rows always): z-lab's newer
    # drafts' `sliding_window_size`, llama.cpp's `use_swa` + `swa_window_size`. Causality stays as set above.
    context_window: int | None = None
    # DFlash2 (z-lab's DFlash2DraftModel, models.dflash2): (conv_kernel_size, conv_group_size) of every layer's
    # causal convolutions and (selector_rank, selector_top_k) of the candidate selector; None in a DFlash draft.
    conv: tuple[int, int] | None = None
    selector: tuple[int, int] | None = None

    @property
    def variant(self) -> str:
        return "dflash2" if self.selector is not None else "dflash"


ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}  # z-lab's config.json names, by variant
# z-lab's DFlash2 checkpoints store the selector's codebooks as bare tensors (its from_pretrained maps them)
CODEBOOKS = {f"candidate_selector.{n}_codebook": f"candidate_selector.{n}_codebook.weight"
             for n in ("predecessor", "successor")}


def draft_weight_names(weights: dict) -> dict:
    """z-lab's weight names (keys of `weights`) to the draft module's."""
    return {CODEBOOKS.get(k, k): v for k, v in weights.items()}


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default choice of target layers to tap: spread evenly over layers 1..N-3. Below 5 layers its
    formula leaves the target (N=2 gives layer -1), so the span is kept inside 0..N-1 there."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    first = min(1, num_target_layers - 1)
    last = max(num_target_layers - 3, first)
    return [round(first + i * (last - first) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def draft_settings(draft_config: PretrainedConfig) -> DraftSettings:
    dflash = getattr(draft_config, "dflash_config", None) or {}
    layer_ids = dflash.get("target_layer_ids") or getattr(draft_config, "target_layer_ids", None)
    if layer_ids is None:
        layer_ids = default_target_layer_ids(draft_config.num_target_layers, draft_config.num_hidden_layers)
    mask = dflash.get("mask_token_id", getattr(draft_config, "mask_token_id", None))
    if mask is None:
        raise CheckpointError("draft config has no dflash_config.mask_token_id: not a DFlash draft checkpoint")
    def setting(key: str, default=None):  # z-lab reads dflash_config first, then the config's top level
        return dflash.get(key, getattr(draft_config, key, default))

    softcap, embed_scale, causal = setting("final_logit_softcapping"), setting("embed_scale"), setting("causal")
    return DraftSettings(list(layer_ids), int(mask), int(getattr(draft_config, "block_size", BLOCK_SIZE)),
                         embed_scale=None if embed_scale is None else float(embed_scale),
                         input_embedding_scale=float(setting("input_embedding_scale", 1.0)),
                         logit_scale=float(setting("output_multiplier", 1.0)),
                         logit_softcap=float(softcap) if softcap and softcap > 0 else None,
                         causal=setting("is_causal", causal), context_window=_context_window(dflash, setting),
                         **_dflash2(setting))


def _dflash2(setting) -> dict:
    """A DFlash2 draft's conv and selector settings; a config with some of the four keys and not all is refused."""
    keys = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    values = {k: setting(k) for k in keys}
    given = [k for k, v in values.items() if v is not None]
    if not given:
        return {}
    if len(given) < len(keys) or not all(isinstance(v, int) and v > 0 for v in values.values()):
        raise CheckpointError(f"draft config: a DFlash2 draft needs {', '.join(keys)} as positive integers, got "
                              f"{values}; fix the draft's config.json")
    return {"conv": (values["conv_kernel_size"], values["conv_group_size"]),
            "selector": (values["selector_rank"], values["selector_top_k"])}


def _context_window(dflash: dict, setting) -> int | None:
    """The window every layer of the draft attends within, as z-lab (`sliding_window_size`) or llama.cpp's
    converter (`use_swa` with `swa_window_size`) write it; None when neither does."""
    window = setting("sliding_window_size") or (dflash.get("swa_window_size") if dflash.get("use_swa") else None)
    if window is None:
        return None
    if not isinstance(window, int) or window < 2:
        raise CheckpointError(f"draft config: sliding_window_size {window!r} must be an integer of at least 2 (the "
                              "anchor and one context position); fix the draft's config.json or remove the key")
    return window


def choose_mask_token(target_dir: Path, vocab_size: int, eos: tuple[int, ...] | list[int] = ()) -> int:
    """The mask token for a new draft: z-lab's choices where the tokenizer offers one, else an EOS id.

    z-lab's released drafts use the tokenizer's own mask token if it has one; else the first embedding
    row past the tokenizer's vocabulary (Qwen3 has 151669 tokens in 151936 rows: its drafts use 151669);
    else the first reserved *special* token (Llama 3 fills every row but reserves
    `<|reserved_special_token_N|>`; an ordinary word such as SmolLM2's `Ġreserved` is no such token).

    A tokenizer with none of these (SmolLM2: 49,152 tokens in 49,152 rows, three special tokens) gets
    the target's first EOS id (`eos`, from its generation config). The mask is only an input marker: the draft sees it at block positions
    1..B-1 and nowhere else (its context comes as taps, not tokens), while position 0 holds the anchor,
    the last emitted token. Any fixed id would do, but an EOS id is the one id that is never an anchor,
    since decoding stops there, so a block's anchor and its masks never look alike; and every chat
    target has one. `train_draft.mask_token_id` overrides it."""
    tok = AutoTokenizer.from_pretrained(target_dir)
    vocab = tok.get_vocab()
    for name in (tok.mask_token, *MASK_NAMES):
        if name is not None and name in vocab and vocab[name] < vocab_size:
            return vocab[name]
    if len(tok) < vocab_size:
        return len(tok)
    reserved = sorted(i for i, t in tok.added_tokens_decoder.items()
                      if t.special and "reserved" in t.content and i < vocab_size)
    if reserved:
        return reserved[0]
    eos = [i for i in eos if 0 <= i < vocab_size]
    if eos:
        return eos[0]
    raise CheckpointError(f"target {target_dir}: its tokenizer fills all {vocab_size} embedding rows and has no mask, "
                          "reserved or EOS token; pick one the target never generates with train_draft.mask_token_id")


def draft_config(target: dict, mask_token_id: int, num_layers: int, block_size: int) -> dict:
    """A z-lab DFlash draft config.json for `target` (its config.json as a dict): same widths, own depth,
    then what the target's family changes in z-lab's layout for it (`Family.draft_layout`: Gemma 4's
    sliding and full layers)."""
    target = target.get("text_config") or target  # a multimodal wrapper's text model
    rope = target.get("rope_parameters") or {"rope_theta": target.get("rope_theta", 10000.0)}
    head_dim = target.get("head_dim") or target["hidden_size"] // target["num_attention_heads"]
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "block_size": block_size,
        "num_target_layers": target["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_token_id,
                          "target_layer_ids": default_target_layer_ids(target["num_hidden_layers"], num_layers)},
        "hidden_size": target["hidden_size"], "intermediate_size": target["intermediate_size"],
        "num_hidden_layers": num_layers, "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target.get("num_key_value_heads") or target["num_attention_heads"],
        "head_dim": head_dim, "vocab_size": target["vocab_size"], "rms_norm_eps": target["rms_norm_eps"],
        "rope_theta": rope.get("rope_theta"), "rope_scaling": None,
        "max_position_embeddings": target["max_position_embeddings"], "attention_bias": False,
        "hidden_act": "silu", "tie_word_embeddings": False, "dtype": "float32",
    }
    family = families.claiming(target.get("model_type"))
    return config | (family.draft_layout(target, num_layers) if family is not None else {})


def init_draft_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded initial weights under z-lab's key names: N(0, 0.02) matrices, unit norms."""
    hidden, heads, kv_heads, head_dim, inter = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    taps = len(config["dflash_config"]["target_layer_ids"])
    weights = {"fc.weight": normal(hidden, taps * hidden),
               "hidden_norm.weight": torch.ones(hidden), "norm.weight": torch.ones(hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": torch.ones(head_dim),
            p + "self_attn.k_norm.weight": torch.ones(head_dim),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    settings = _dflash2(lambda key: config["dflash_config"].get(key, config.get(key)))
    if settings:  # DFlash2, as SpecForge's and NeMo's reproductions start it (z-lab publishes no training init):
        # convolutions that are the identity (a DFlash draft's layers), a selector that adds nothing (zero successors)
        (kernel, group), (rank, _) = settings["conv"], settings["selector"]
        identity = torch.zeros(2, kernel, hidden)
        identity[:, 0] = 1
        for i in range(config["num_hidden_layers"]):
            for conv in ("attention_conv", "mlp_conv"):
                weights |= {f"layers.{i}.{conv}.base_kernel": identity.clone(),
                            f"layers.{i}.{conv}.kernel_projection.weight": torch.zeros(2 * kernel * (hidden // group), hidden)}
        weights |= {"candidate_selector.predecessor_codebook": normal(config["vocab_size"], rank),
                    "candidate_selector.successor_codebook": torch.zeros(config["vocab_size"], rank),
                    "candidate_selector.hidden_projection.weight": normal(rank, hidden)}
    return weights


def save_draft(out: Path, config: dict, weights: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors in z-lab's layout (the borrowed embedding and head left out)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    stored = {ours: theirs for theirs, ours in CODEBOOKS.items()}
    kept = {stored.get(k, k): v.detach().contiguous() for k, v in weights.items() if k not in BORROWED}
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})


def set_embed_scale(draft_dir: Path, scale: float) -> None:
    """Pin the draft's block-embedding scale in its config.json (`dflash_config.embed_scale`, the key
    ExecuTorch's MLX DFlash example reads too)."""
    path = draft_dir / "config.json"
    config = json.loads(path.read_text())
    config.setdefault("dflash_config", {})["embed_scale"] = float(scale)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def borrow(draft: nn.Module, target: nn.Module) -> None:
    """Point the draft's embedding and head at the target's own parameters (shared, not copied)."""
    draft.embed_tokens.weight = target.embed_tokens.weight
    draft.lm_head.weight = target.lm_head.weight
