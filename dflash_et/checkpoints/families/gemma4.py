"""Gemma 4 (`google/gemma-4-31B-it`'s layout): sliding and full layers that differ in head dim, KV heads,
K = V and RoPE; sandwich norms, layer scalars, a scaled embedding, softcapped logits. The small (E2B/E4B)
and MoE checkpoints' features are refused. z-lab's Gemma 4 draft has sliding layers then one full layer."""

from transformers import Gemma4ForCausalLM, Gemma4TextConfig, PretrainedConfig, PreTrainedTokenizerFast
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

from dflash_et.checkpoints.families.base import Builtin, Family, RopeTables, rope_table
from dflash_et.errors import CheckpointError
from dflash_et.models.attention import AttentionSpec

# Gemma 4 features of the small (E2B/E4B) and MoE checkpoints the project does not build
UNSUPPORTED = {"hidden_size_per_layer_input": "per-layer embeddings", "num_kv_shared_layers": "KV sharing",
               "enable_moe_block": "mixture-of-experts blocks", "use_double_wide_mlp": "double-wide MLPs"}

# Gemma 4 31B's layout in small: its special tokens where Gemma keeps them (`<mask>` is 4, the mask
# token z-lab's Gemma 4 draft uses), its turn markers, five sliding layers then one full layer with K = V,
# softcapped logits, tied embeddings. The window (32) is shorter than a prompt plus reply, so the
# pipeline's programs run past it.
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "<bos>{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n{{ message['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
SHAPE = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, global_head_dim=128, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=32,
    layer_types=["sliding_attention"] * 5 + ["full_attention"], hidden_size_per_layer_input=0,
    final_logit_softcapping=30.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
)


def layer(c: PretrainedConfig, i: int, kind: str, causal: bool | None) -> AttentionSpec:
    layer = c.per_layer_config[i]
    full = kind == "full_attention"
    return AttentionSpec(num_heads=c.num_attention_heads, num_kv_heads=layer.num_key_value_heads,
                         head_dim=layer.head_dim, qk_norm=True, v_norm=True, bias=bool(c.attention_bias),
                         causal=causal, window=None if full else c.sliding_window, scale=1.0,
                         k_eq_v=bool(c.attention_k_eq_v) and full, rope=kind)


def args(c: PretrainedConfig) -> dict:
    return dict(sandwich_norms=True, embed_scale=c.hidden_size ** 0.5)


def rope(c: PretrainedConfig, max_seq_len: int) -> RopeTables:
    """One table per layer type (their head dims and thetas differ; full layers' RoPE is proportional)."""
    rotary = Gemma4TextRotaryEmbedding(c)
    return {kind: rope_table(rotary, max_seq_len, kind) for kind in sorted(set(c.layer_types))}


def refuse(c: PretrainedConfig) -> None:
    for key, feature in UNSUPPORTED.items():
        if getattr(c, key, None):
            raise CheckpointError(f"Gemma 4 {feature} ({key}={getattr(c, key)}) are not supported; the 31B layout is")


def refuse_json(raw: dict, where: str) -> None:
    if raw.get("model_type") == "gemma4" and "text_config" not in raw:  # transformers would default it silently
        raise CheckpointError(f"{where}: a gemma4 config without text_config; use the checkpoint's "
                              "original config.json (or a gemma4_text one)")


def draft_layout(target: dict, num_layers: int) -> dict:
    """z-lab's Gemma 4 draft: sliding layers (twice the target's window) then one full layer, RoPE theta of
    the target's full layers, logits softcapped like the target's."""
    return {"layer_types": ["sliding_attention"] * (num_layers - 1) + ["full_attention"],
            "use_sliding_window": True, "sliding_window": 2 * target["sliding_window"],
            "rope_theta": target["rope_parameters"]["full_attention"]["rope_theta"],
            "final_logit_softcapping": target.get("final_logit_softcapping")}


def builtin_config(tokenizer: PreTrainedTokenizerFast, shape: dict) -> tuple[Gemma4TextConfig, list[int], int]:
    """EOS: the end of a turn, then `<eos>`; `<pad>` pads."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    eos = [ids["<end_of_turn>"], ids["<eos>"]]
    config = Gemma4TextConfig(tie_word_embeddings=True, pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"],
                              eos_token_id=eos, dtype="float32", **shape)
    return config, eos, ids["<pad>"]


FAMILY = Family(
    name="gemma4", model_types=("gemma4_text", "gemma4"), layer=layer, args=args, rope=rope, refuse=refuse,
    refuse_json=refuse_json, draft_layout=draft_layout,
    builtin=Builtin(source="builtin-gemma", shape=SHAPE, config=builtin_config, model=Gemma4ForCausalLM,
                    sampling=dict(temperature=1.0, top_p=0.95, top_k=64),
                    tokenizer=dict(special_tokens=SPECIAL_TOKENS, eos="<end_of_turn>", pad="<pad>",
                                   chat_template=CHAT_TEMPLATE)),
)
