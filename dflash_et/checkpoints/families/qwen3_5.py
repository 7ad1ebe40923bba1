"""Qwen3.5 (hybrid, `Qwen/Qwen3.5-4B`'s layout): Gated DeltaNet layers between gated full-attention layers,
partial rotary, zero-centred norms. Its multimodal RoPE is plain RoPE for text (every axis at the same
position); the multimodal wrapper's vision tower and the multi-token-prediction head are not loaded."""

from transformers import PretrainedConfig, PreTrainedTokenizerFast, Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from dflash_et.checkpoints.families.base import Builtin, Family, Layer, RopeTables, attention, rope_table
from dflash_et.models.deltanet import DeltaNetSpec

# Qwen3.5 (hybrid) in small: three Gated DeltaNet layers to one gated full-attention layer, twice as many
# value heads as key heads, partial rotary (a quarter of the head), zero-centred norms, as Qwen3.5-4B.
SHAPE = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
)


def layer(c: PretrainedConfig, i: int, kind: str, causal: bool | None) -> Layer:
    if kind == "linear_attention":
        return DeltaNetSpec(c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                            c.linear_value_head_dim, c.linear_conv_kernel_dim)
    return attention(c, kind, causal, qk_norm=True, output_gate=True)


def args(c: PretrainedConfig) -> dict:
    return dict(norm_offset=1.0)


def rope(c: PretrainedConfig, max_seq_len: int) -> RopeTables:
    return {"default": rope_table(Qwen3_5TextRotaryEmbedding(c), max_seq_len)}


def builtin_config(tokenizer: PreTrainedTokenizerFast, shape: dict) -> tuple[Qwen3_5TextConfig, list[int], int]:
    """Qwen's tokens, as the Qwen3 family's built-in target: EOS the end of a turn and the end of the text."""
    eos = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    config = Qwen3_5TextConfig(
        tie_word_embeddings=True, pad_token_id=eos[1], bos_token_id=eos[1], eos_token_id=eos[0], dtype="float32",
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}, **shape)
    return config, eos, eos[1]


FAMILY = Family(
    name="qwen3_5", model_types=("qwen3_5_text", "qwen3_5"), layer=layer, args=args, rope=rope,
    builtin=Builtin(source="builtin-hybrid", shape=SHAPE, config=builtin_config, model=Qwen3_5ForCausalLM,
                    sampling=dict(temperature=0.7, top_p=0.8, top_k=20),
                    tokenizer=dict(calls="xml")),  # Qwen3.5 writes calls in XML, where Qwen3 writes JSON
)
