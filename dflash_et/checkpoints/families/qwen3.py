"""Qwen3 (`Qwen/Qwen3-4B`, ...): Llama's stack with RMS-normed Q and K; the built-in pair's target.

z-lab's DFlash drafts are Qwen3 stacks too (`model_type: qwen3`, sliding layers where their target has
them), so draft configs map through this family as well."""

from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dflash_et.checkpoints.families.base import Builtin, Family, attention

# Qwen3-4B's layout in small: GQA, head_dim * heads != hidden, untied head
SHAPE = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-6,
)


def layer(c, i: int, kind: str, causal: bool | None):
    return attention(c, kind, causal, qk_norm=True)


def builtin_config(tokenizer: PreTrainedTokenizerFast, shape: dict) -> tuple[Qwen3Config, list[int], int]:
    """EOS: the end of a turn, then the end of the text (the tokenizer's pad token), which is also BOS."""
    eos = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    config = Qwen3Config(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                         bos_token_id=eos[1], eos_token_id=eos[0], dtype="float32", **shape)
    return config, eos, eos[1]


FAMILY = Family(
    name="qwen3", model_types=("qwen3",), layer=layer,
    # sampling: what Qwen3's generation_config.json recommends with thinking off, as the built-in chats are
    builtin=Builtin(source=None, shape=SHAPE, config=builtin_config, model=Qwen3ForCausalLM,
                    sampling=dict(temperature=0.7, top_p=0.8, top_k=20)),
)
