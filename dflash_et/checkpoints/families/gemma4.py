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
# token z-lab's Gemma 4 draft uses), five sliding layers then one full layer with K = V, softcapped logits, tied
# embeddings. The window (32) is shorter than a prompt plus reply, so the pipeline's programs run past it.
# Its chat format is Gemma 4's: `<bos>`, turns `<|turn>ROLE\n...<turn|>\n` (the assistant's role is `model`), a
# generation prompt that with thinking off opens an empty thought channel (`<|channel>thought\n<channel|>`, which
# earlier model turns drop), tools declared in the system turn (`<|tool>declaration:NAME{..}<tool|>`), calls as
# `<|tool_call>call:NAME{key:<|"|>value<|"|>}<tool_call|>` and results as `<|tool_response>response:NAME{..}
# <tool_response|>`: what ExecuTorch's Gemma server and its tool parser read.
TURN, END_TURN, CHANNEL, END_CHANNEL, THINK = "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", TURN, END_TURN, CHANNEL, END_CHANNEL, THINK,
                  "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>"]
CHAT_TEMPLATE = (
    "{{- '<bos>' }}"
    "{%- set system = messages[0].content if messages and messages[0].role == 'system' else none %}"
    "{%- if system is not none or tools or enable_thinking is true %}{{- '<|turn>system\\n' }}"
    "{%- if enable_thinking is true %}{{- '<|think|>' }}{%- endif %}{{- system or '' }}"
    "{%- for tool in tools or [] %}{%- set tool = tool.function if tool.function is defined else tool %}"
    "{{- '<|tool>declaration:' + tool.name + '{description:<|\"|>' + (tool.description or '') + '<|\"|>,parameters:' }}"
    "{{- tool.parameters | tojson }}{{- '}<tool|>' }}{%- endfor %}{{- '<turn|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|tool_response>response:' + (message.name or 'result') + '{value:<|\"|>' + message.content + '<|\"|>}' }}"
    "{{- '<tool_response|>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<turn|>\\n' }}{%- endif %}"
    "{%- elif message.role != 'system' or not loop.first %}"
    "{{- '<|turn>' + ('model' if message.role == 'assistant' else message.role) + '\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}{%- set call = call.function if call.function is defined else call %}"
    "{{- '<|tool_call>call:' + call.name + '{' }}{%- if call.arguments is mapping %}"
    "{%- for key, value in call.arguments.items() %}{{- key + ':' }}{%- if value is string %}"
    "{{- '<|\"|>' + value + '<|\"|>' }}{%- else %}{{- value | tojson }}{%- endif %}{%- if not loop.last %},{%- endif %}"
    "{%- endfor %}{%- else %}{{- call.arguments }}{%- endif %}{{- '}<tool_call|>' }}"
    "{%- endfor %}"
    "{%- if not (message.tool_calls and not loop.last and messages[loop.index0 + 1].role == 'tool') %}"
    "{{- '<turn|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|turn>model\\n' }}"
    "{%- if enable_thinking is not true %}{{- '<|channel>thought\\n<channel|>' }}{%- endif %}{%- endif %}"
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
    eos = [ids[END_TURN], ids["<eos>"]]
    config = Gemma4TextConfig(tie_word_embeddings=True, pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"],
                              eos_token_id=eos, dtype="float32", **shape)
    return config, eos, ids["<pad>"]


FAMILY = Family(
    name="gemma4", model_types=("gemma4_text", "gemma4"), layer=layer, args=args, rope=rope, refuse=refuse,
    refuse_json=refuse_json, draft_layout=draft_layout,
    builtin=Builtin(source="builtin-gemma", shape=SHAPE, config=builtin_config, model=Gemma4ForCausalLM,
                    sampling=dict(temperature=1.0, top_p=0.95, top_k=64),
                    tokenizer=dict(special_tokens=SPECIAL_TOKENS, eos=END_TURN, pad="<pad>",
                                   chat_template=CHAT_TEMPLATE)),
)
