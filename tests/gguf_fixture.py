"""Tiny GGUF model files, written the way llama.cpp's `convert_hf_to_gguf.py` writes them.

The project imports GGUF checkpoints (GGUF -> HF-layout safetensors). To test that import without
downloading a real GGUF, tests build a small random HF model here, write it to GGUF with the `gguf`
package's own writer, and compare the import against transformers' loader
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`), which reads these files back to the
source model exactly (F32) -- `tests/test_gguf_fixture.py` proves that.

What "the way llama.cpp does" covers, so an importer that handles these files handles real ones:

* tensor names: `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
  ffn_gate, ffn_up, ffn_down}` (+ `attn_q_norm` / `attn_k_norm` for qwen3), `output_norm`, `output`;
  `output.weight` is left out when the LM head is tied to the embedding, which is also how a
  reader tells a tied model from an untied one;
* llama's Q/K row permutation (llama.cpp stores Q and K with each head's rotary halves interleaved,
  for its non-NeoX RoPE; readers must undo it). Qwen3 uses NeoX RoPE in llama.cpp and is stored
  unpermuted;
* shapes as numpy sees them (GGUF lists dims innermost-first; the writer reverses them);
* tensor types: 1-D tensors and norms stay F32, 2-D weights take `qtype`;
* architecture metadata under `<arch>.*` and a GPT-2-style byte-level BPE tokenizer under
  `tokenizer.ggml.*`, with the chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

# dflash_et first: it sets the thread count, which has to happen before torch is imported
from dflash_et.checkpoints.builtin import build_tokenizer  # isort: skip

import gguf
import numpy as np
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast, Qwen3Config,
                          Qwen3ForCausalLM)

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML_SPECIALS = [ENDOFTEXT, IM_START, IM_END]
# ChatML, as SmolLM2-Instruct and Qwen use it
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# qtype name -> (the ggml type 2-D weights are stored in, `general.file_type`). All four can be written
# by gguf 0.19 (F16 by numpy, Q8_0 / Q4_0 by `gguf.quants.quantize`); its K-quants (Q4_K, Q6_K, ...)
# and I-quants have dequantizers only, so they cannot be written from Python and are not offered.
QTYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "F32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}

# HF model_type -> GGUF `general.architecture`. Both load through transformers' GGUF loader; other
# families (qwen2, mistral, gemma, ...) would need their own quirks here and are refused.
ARCHS = {"llama": "llama", "qwen3": "qwen3"}

_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",  # qwen3
    "self_attn.k_norm": "attn_k_norm",  # qwen3
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensor_name(hf_name: str) -> str:
    """The GGUF name of an HF parameter (`model.layers.3.mlp.up_proj.weight` -> `blk.3.ffn_up.weight`).

    Spelled out rather than taken from `gguf.get_tensor_name_map`, because transformers' loader
    itself uses that map to go back: a test built on it would agree with the loader by construction.
    """
    stem, _, suffix = hf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in _LAYER_NAMES:
        return f"blk.{parts[2]}.{_LAYER_NAMES['.'.join(parts[3:])]}.{suffix}"
    raise NotImplementedError(f"no GGUF name for {hf_name!r}")


def llama_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` for attn_q (`n_head, n_head`) and attn_k (`n_head, n_head_kv`).

    HF's llama rotates the two halves of each head (`rotate_half`); llama.cpp's rope pairs adjacent
    dims, so its converter interleaves each head's halves: rows `[a0..a7, b0..b7]` -> `[a0 b0 a1 b1 ...]`.
    """
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _tensor_type(gguf_name: str, array: np.ndarray, qtype: str) -> gguf.GGMLQuantizationType:
    """llama.cpp's choice: norms and other 1-D tensors stay F32; 2-D weights take `qtype`, falling back
    to F16 when a row is not a whole number of quantization blocks (as `convert_hf_to_gguf` does)."""
    if array.ndim <= 1 or gguf_name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    ggml_type = QTYPES[qtype][0]
    block, _ = gguf.GGML_QUANT_SIZES[ggml_type]
    if array.shape[-1] % block:
        return gguf.GGMLQuantizationType.F16
    return ggml_type


def _tokenizer_metadata(tokenizer: PreTrainedTokenizerFast, vocab_size: int, config) -> dict:
    """The `tokenizer.ggml.*` content llama.cpp's `_set_vocab_gpt2` + `gguf.SpecialVocab` write for a
    byte-level BPE tokenizer: tokens by id (padded with `[PADn]` up to the model's vocab), token types
    (CONTROL for special added tokens, USER_DEFINED for other added tokens), merges, special ids
    (from the tokenizer, else from the model config, as SpecialVocab falls back to config.json)."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    model, pre = backend["model"], backend["pre_tokenizer"]
    if model["type"] != "BPE" or backend["normalizer"] is not None or pre is None or pre["type"] != "ByteLevel" \
            or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        # another split (Qwen2's, Llama 3's) is a different `tokenizer.ggml.pre`, which llama.cpp
        # identifies by hashing a test string; only GPT-2's own is written here.
        raise NotImplementedError("only GPT-2-style byte-level BPE tokenizers (ByteLevel pre-tokenizer) are written")
    vocab = tokenizer.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(max(vocab_size, len(vocab))):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    def special_id(name: str) -> int | None:
        token_id = getattr(tokenizer, f"{name}_token_id", None)
        if token_id is None:
            token_id = getattr(config, f"{name}_token_id", None)
            token_id = token_id[0] if isinstance(token_id, list) else token_id
        return token_id

    return dict(tokens=tokens, types=types, merges=merges, ids={n: special_id(n) for n in ("bos", "eos", "unk", "pad")},
                add_bos=bool(getattr(tokenizer, "add_bos_token", False)),
                add_eos=bool(getattr(tokenizer, "add_eos_token", False)))


def write_gguf(path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, qtype: str = "F32") -> Path:
    """Write `model` and `tokenizer` to one GGUF file at `path` (a `.gguf` file, or an existing directory to
    write `<arch>-<qtype>.gguf` into); return the file's path.

    `model`: a `LlamaForCausalLM` or `Qwen3ForCausalLM` (no attention bias). qwen3 caveat: transformers
    5.24's loader takes no head_dim from a qwen3 GGUF (it ignores `attention.key_length`, which is
    written here as llama.cpp does), so it rebuilds the model with Qwen3Config's default head_dim of
    128 -- only a qwen3 with head_dim 128 (every real one, and `tiny_qwen3`) loads back there.
    `tokenizer`: a byte-level BPE with GPT-2's pre-tokenizer (`tiny_tokenizer`'s kind).
    `qtype`: how 2-D weight matrices (embedding and head included) are stored: "F32", "F16", "Q8_0" or
    "Q4_0"; norms stay F32, and a matrix whose rows are not whole 32-value blocks falls back to F16,
    as in llama.cpp. "Q4_0" is not something `convert_hf_to_gguf.py` emits (that is llama-quantize's
    job, which would also pick Q6_K for `output`); here every matrix is plain Q4_0. K-quants cannot
    be written by gguf 0.19 (it only dequantizes them).
    """
    if qtype not in QTYPES:
        raise ValueError(f"qtype {qtype!r} not in {sorted(QTYPES)}")
    config = model.config
    if config.model_type not in ARCHS:
        raise NotImplementedError(f"model_type {config.model_type!r}: only {sorted(ARCHS)} are written")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise NotImplementedError("attention / MLP biases are not written")
    arch = ARCHS[config.model_type]
    path = Path(path)
    if path.is_dir():
        path = path / f"{arch}-{qtype}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)

    n_head, n_head_kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_head
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"rope_type {rope['rope_type']!r} is not written")
    rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()

    writer = gguf.GGUFWriter(path, arch)
    # -- general.* and <arch>.*, in the order TextModel / LlamaModel.set_gguf_parameters write them
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    if rope_theta is not None:
        writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if getattr(config, "head_dim", None) is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(QTYPES[qtype][1])
    if arch == "llama":  # LlamaModel adds these two; Qwen2/Qwen3Model do not (readers take the vocab from the tokens)
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(head_dim)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # -- tokenizer.*
    tok = _tokenizer_metadata(tokenizer, config.vocab_size, config)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    writer.add_token_merges(tok["merges"])
    for name, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        if tok["ids"][name] is not None:
            add(int(tok["ids"][name]))
    writer.add_add_bos_token(tok["add_bos"])
    writer.add_add_eos_token(tok["add_eos"])
    if isinstance(tokenizer.chat_template, str):
        writer.add_chat_template(tokenizer.chat_template)

    # -- tensors, in the model's order
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue  # the head is the embedding: llama.cpp writes no `output.weight`
        name = gguf_tensor_name(hf_name)
        array = tensor.detach().to(torch.float32).cpu().numpy()
        if arch == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
            array = llama_permute(array, n_head, n_head)
        elif arch == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
            array = llama_permute(array, n_head, n_head_kv)
        ggml_type = _tensor_type(name, array, qtype)
        data = gguf.quants.quantize(np.ascontiguousarray(array), ggml_type)
        writer.add_tensor(name, data, raw_dtype=ggml_type)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 pre-tokenizer) trained on the project's corpus in ~0.1 s, with ChatML's
    special tokens (`<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2), eos `<|im_end|>`, pad
    `<|endoftext|>` and a ChatML chat template. It has exactly `vocab_size` tokens (the corpus has
    far more than 512 merges to learn), so a model sized to it has no spare embedding row."""
    tokenizer = build_tokenizer(special_tokens=CHATML_SPECIALS, eos=IM_END, pad=ENDOFTEXT,
                                chat_template=CHATML_TEMPLATE, vocab_size=vocab_size)
    assert len(tokenizer) == vocab_size, (len(tokenizer), vocab_size)
    return tokenizer


def _spread_weights(model: PreTrainedModel, seed: int) -> None:
    """Re-draw every weight at a scale where it matters: HF's init (std 0.02, norms exactly 1) gives
    near-uniform attention and logits, so a mis-permuted Q/K or swapped norms would hardly move the
    logits and a comparison would pass anyway. Matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1),
    norms ~ 1 + N(0, 0.2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            else:
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5)


def _special_ids(tokenizer: PreTrainedTokenizerFast) -> dict:
    """Config ids as SmolLM2 / Qwen set them: bos = pad = `<|endoftext|>`, eos = `<|im_end|>`."""
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    return dict(bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext)


def tiny_llama(tie: bool = True, seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A random small `LlamaForCausalLM` (hidden 64, 2 layers, 4 heads / 2 KV heads of 16, FFN 128) and
    its `tiny_tokenizer`, vocab = the tokenizer's size. `tie`: tie the LM head to the embedding (as
    SmolLM2 does). Weights are spread out (`_spread_weights`) so every tensor moves the logits."""
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=tie,
        dtype="float32", **_special_ids(tokenizer),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    _spread_weights(model, seed)
    return model, tokenizer


def tiny_qwen3(tie: bool = False, seed: int = 0) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """A random small `Qwen3ForCausalLM` (hidden 64, 2 layers, 4 heads / 2 KV heads, FFN 128) and its
    `tiny_tokenizer`. head_dim is 128, Qwen3's default: transformers' GGUF loader takes no head_dim
    from a qwen3 file (see `write_gguf`), so only that value loads back there."""
    tokenizer = tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=tie,
        dtype="float32", **_special_ids(tokenizer),
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    _spread_weights(model, seed)
    return model, tokenizer
