"""Checkpoints for tests: random-weight Hugging Face checkpoints of every family, z-lab-layout drafts, chat
checkpoints laid out as the real ones are, the small trained pair's settings (the `trained_pair` fixture), and
what a pair's own files say the programs must report."""

from pathlib import Path


# A target small enough to train in seconds, and a draft trained for it: DFlash through the programs then
# accepts several proposals per round (a random draft accepts almost none, and random weights hide bugs
# such as identical norms in both programs).
SMALL_TARGET = dict(hidden_size=96, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24)


# no long chats; tool calls for dflash serve's tests
SMALL_TARGET_TRAINING = dict(steps=300, batch=16, samples=2000, long_steps=0, tool_batch=4)


SMALL_DRAFT_TRAINING = dict(steps=500, num_prompts=96, heldout=6, max_new_tokens=40, block_size=8, anchors=8, batch=4,
                            max_seq_len=256, lr=3e-3, num_layers=1)


def checkpoint_facts(pair: tuple[Path, Path]) -> dict:
    """What a pair's own files say the programs must report: tests read these instead of repeating constants."""
    import json

    target = json.loads((pair[0] / "config.json").read_text())
    draft = json.loads((pair[1] / "config.json").read_text())
    eos = json.loads((pair[0] / "generation_config.json").read_text())["eos_token_id"]
    return {"vocab_size": target["vocab_size"], "hidden_size": target["hidden_size"], "eos_ids": sorted(eos),
            "mask_token_id": draft["dflash_config"]["mask_token_id"], "block_size": draft["block_size"],
            "target_layer_ids": draft["dflash_config"]["target_layer_ids"]}


GEMMA_SHAPE = dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                   hidden_size_per_layer_input=0, sliding_window=4, final_logit_softcapping=30.0,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                                "sliding_attention", "full_attention"], num_hidden_layers=6)


# Qwen3.5's layout in small: DeltaNet layers with twice the value heads of key heads and key dim != value
# dim, gated full-attention layers with partial rotary (a quarter of head_dim 32)
QWEN3_5_SHAPE = dict(head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=24, linear_conv_kernel_dim=4, full_attention_interval=2,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))


def random_checkpoint(path: Path, family: str, shard: bool = False, **overrides) -> Path:
    """A random-weight Hugging Face checkpoint of `family` (qwen3, llama, gemma4_text, gemma4: Gemma 4's
    multimodal wrapper, qwen3_5_text: Qwen3.5's hybrid text model, or qwen3_5: its multimodal wrapper with
    a tiny vision tower), saved by transformers. Norm weights, Gemma's layer scalars and the DeltaNet
    layers' time-step biases are randomized too: left at their initial values, a model that skips or
    swaps them would still match."""
    import torch
    from transformers import (Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig,
                              LlamaConfig, LlamaForCausalLM, Qwen3_5Config, Qwen3_5ForCausalLM,
                              Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM)

    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1)
    if family.startswith("gemma4"):
        shape |= GEMMA_SHAPE
    if family.startswith("qwen3_5"):
        shape |= QWEN3_5_SHAPE
    configs = {"qwen3": Qwen3Config, "llama": LlamaConfig, "qwen3_5_text": Qwen3_5TextConfig, "qwen3_5": Qwen3_5TextConfig}
    config = configs.get(family, Gemma4TextConfig)(**{**shape, **overrides})
    model_cls = {"qwen3": Qwen3ForCausalLM, "llama": LlamaForCausalLM, "gemma4_text": Gemma4ForCausalLM,
                 "gemma4": Gemma4ForConditionalGeneration, "qwen3_5_text": Qwen3_5ForCausalLM,
                 "qwen3_5": Qwen3_5ForConditionalGeneration}[family]
    if family == "gemma4":
        config = Gemma4Config(text_config=config.to_dict(), vision_config=None, audio_config=None)
    if family == "qwen3_5":
        config = Qwen3_5Config(text_config=config.to_dict(), vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=config.hidden_size),
            tie_word_embeddings=config.tie_word_embeddings)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "layer_scalar", "dt_bias")):
                t.copy_(torch.empty_like(t).uniform_(0.5, 1.5))
    model.save_pretrained(path, max_shard_size="100KB" if shard else "5GB")
    return path


def random_draft(path: Path, target_dir: Path, num_layers: int = 3, block: int = 8, **dflash) -> Path:
    """A draft in z-lab's layout for `target_dir` (for a Gemma 4 target, z-lab's Gemma 4 layout), mask token
    4, with random weights and norms; `dflash` keys go into its dflash_config (DFlash2's make a DFlash2 draft)."""
    import json

    import torch

    from dflash_et.checkpoints import zlab

    config = zlab.draft_config(json.loads((target_dir / "config.json").read_text()), 4, num_layers, block)
    config["dflash_config"] |= dflash
    if "selector_top_k" in dflash:
        config["architectures"] = [zlab.ARCHITECTURES["dflash2"]]
    g = torch.Generator().manual_seed(1)
    weights = {k: (v if v.any() else torch.randn(v.shape, generator=g) * 0.02) * 5 if v.dim() == 2  # DFlash2's
               else torch.empty_like(v).uniform_(0.5, 1.5, generator=g)                          # zero inits too
               for k, v in zlab.init_draft_weights(config, seed=0).items()}
    zlab.save_draft(path, config, weights)
    return path


# (family, overrides, sharded): GQA, MHA, MQA, tied and untied heads, head_dim != hidden/heads,
# biases, Llama-3.1 rope scaling that actually bends frequencies at these lengths, and sliding-window
# layers (a window shorter than the test's calls).
TARGET_CONFIGS = {
    "qwen3-gqa-headdim": ("qwen3", dict(head_dim=32, tie_word_embeddings=False), False),
    "qwen3-tied-mha": ("qwen3", dict(num_key_value_heads=4, tie_word_embeddings=True), False),
    "llama31-mqa-sharded": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)), True),
    "llama-bias-headdim": ("llama", dict(head_dim=24, attention_bias=True, mlp_bias=True,
                                         tie_word_embeddings=False), False),
    "qwen3-sliding-window": ("qwen3", dict(use_sliding_window=True, sliding_window=5, max_window_layers=2), False),
    # Gemma 4 31B's layout in small: sliding and full layers with their own head dims, KV heads and RoPE,
    # K = V on full layers, softcapped logits; the window (4) shorter than the calls
    "gemma4-text": ("gemma4_text", {}, False),
    "gemma4-multimodal-sharded": ("gemma4", dict(attention_k_eq_v=False, num_global_key_value_heads=2), True),
}


LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  *(f"<|reserved_special_token_{i}|>" for i in range(4))]


LLAMA_TEMPLATE = ("{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}"
                  "<|eot_id|>{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
                  "\n\n{%- endif %}")


QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def chat_checkpoint(path: Path, family: str, **overrides) -> Path:
    """A local checkpoint laid out as the real ones are, whose tokenizer has no mask token (as no real Qwen3,
    Llama or Gemma tokenizer has): Qwen3's has fewer tokens than embedding rows, Llama 3's fills every row
    and reserves special tokens. `overrides` go to its config (random_checkpoint)."""
    from dflash_et.checkpoints import builtin

    if family == "qwen3":
        tok = builtin.build_tokenizer(QWEN3_SPECIALS, "<|im_end|>", "<|endoftext|>", vocab_size=600)
        vocab, eos = 640, ["<|im_end|>", "<|endoftext|>"]
    else:
        tok = builtin.build_tokenizer(LLAMA_SPECIALS, "<|eot_id|>", "<|end_of_text|>", LLAMA_TEMPLATE, vocab_size=600)
        vocab, eos = len(tok), ["<|eot_id|>", "<|end_of_text|>"]
    eos_ids = [tok.convert_tokens_to_ids(t) for t in eos]
    random_checkpoint(path, family, vocab_size=vocab, eos_token_id=eos_ids, bos_token_id=eos_ids[1], **overrides)
    tok.save_pretrained(path)
    return path


GEMMA_DRAFT_BLOCK = 8  # gemma_draft's block


def gemma_draft(path: Path, target_dir: Path, num_layers: int = 3, **dflash) -> Path:
    """A draft in z-lab's Gemma 4 layout for `target_dir`, with random weights and norms."""
    return random_draft(path, target_dir, num_layers, GEMMA_DRAFT_BLOCK, **dflash)


DFLASH2 = dict(conv_kernel_size=4, conv_group_size=8, selector_rank=8, selector_top_k=6)  # the tests' DFlash2 drafts
