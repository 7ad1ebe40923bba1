"""The built-in tiny model pair: a Qwen3-architecture target and a z-lab-layout DFlash draft.

Model hubs are not always reachable (CI, air-gapped build hosts), yet every stage must run
end to end. So the project writes its own pair, deterministically (fixed seeds, fixed
corpus), in exactly the file layout of the real checkpoints (`Qwen/Qwen3-4B`,
`z-lab/Qwen3-4B-DFlash-b16`): downstream code then has a single path for both.
"""

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dflash_et.corpus import samples
from dflash_et.threads import all_cores

SEED = 0
VOCAB_SIZE = 2048  # embedding rows; like Qwen3, more than the tokenizer has
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK, MASK = "<think>", "</think>", "<|mask|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, THINK, END_THINK, MASK]

# Qwen3's template, reduced to what a chat needs: roles, a generation prompt, and the
# empty think block that `enable_thinking=False` inserts.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)

TARGET_SHAPE = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-6,
)
DRAFT_LAYERS = 2
DRAFT_BLOCK_SIZE = 16


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default choice of target layers to tap: spread evenly over layers 1..N-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (like Qwen's) trained on the project's corpus, so any text round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [f"{prompt}\n{answer}" for _, prompt, answer in samples(3000, seed=SEED)]
    tok.train_from_iterator(text, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT, chat_template=CHAT_TEMPLATE,
        model_max_length=TARGET_SHAPE["max_position_embeddings"],
    )


def write_target(out: Path, trained: bool = True) -> None:
    """Write the built-in target: config, generation config, safetensors and tokenizer.

    `trained`: the default built-in target is a small LM trained here on the project's corpus, so
    its greedy replies follow the corpus and a draft can learn them; untrained, it is random
    weights in the same layout (seconds instead of minutes, for tests).
    """
    tokenizer = build_tokenizer()
    eos = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=eos[1], eos_token_id=eos[0], dtype="float32", **TARGET_SHAPE,
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config)
    if trained:
        train_target(model, tokenizer)
    model.generation_config = GenerationConfig(bos_token_id=eos[1], eos_token_id=eos, pad_token_id=eos[1])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


TARGET_TRAINING = dict(steps=400, batch=32, lr=3e-3, warmup=20, samples=4000, seed=SEED + 2)


@all_cores()
def train_target(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast) -> None:
    """Next-token training on corpus chats, each rendered exactly as a generation prompt plus reply."""
    from tqdm import tqdm

    t = TARGET_TRAINING
    chats = []
    for _, prompt, answer in samples(t["samples"], seed=t["seed"]):
        head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
        chats.append(tokenizer.encode(head + answer + IM_END + "\n"))
    gen = torch.Generator().manual_seed(t["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / t["warmup"]) * 0.5 * (1 + math.cos(math.pi * s / t["steps"])))
    model.train()
    for _ in tqdm(range(t["steps"]), desc="training the built-in target"):
        batch = [chats[i] for i in torch.randint(0, len(chats), (t["batch"],), generator=gen).tolist()]
        length = max(map(len, batch))
        ids = torch.zeros(len(batch), length, dtype=torch.long)
        labels = torch.full((len(batch), length), -100)
        for i, seq in enumerate(batch):
            ids[i, :len(seq)] = labels[i, :len(seq)] = torch.tensor(seq)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    model.eval()


def draft_config(target: dict, mask_token_id: int, num_layers: int, block_size: int) -> dict:
    """A z-lab DFlash draft config.json for `target` (its config.json as a dict): same widths, own depth."""
    rope = target.get("rope_parameters") or {"rope_theta": target.get("rope_theta", 10000.0)}
    head_dim = target.get("head_dim") or target["hidden_size"] // target["num_attention_heads"]
    return {
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
        "rope_theta": rope["rope_theta"], "rope_scaling": None,
        "max_position_embeddings": target["max_position_embeddings"], "attention_bias": False,
        "hidden_act": "silu", "tie_word_embeddings": False, "dtype": "float32",
    }


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
    return weights


def save_draft(out: Path, config: dict, weights: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors in z-lab's layout (the borrowed embedding and head left out)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    kept = {k: v.detach().contiguous() for k, v in weights.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})


def mask_token_id(target_dir: Path) -> int:
    return PreTrainedTokenizerFast.from_pretrained(target_dir).convert_tokens_to_ids(MASK)


def write_draft(out: Path, target_dir: Path) -> None:
    """Write the built-in (random) draft in z-lab's layout for the target in `target_dir`."""
    target = json.loads((target_dir / "config.json").read_text())
    config = draft_config(target, mask_token_id(target_dir), DRAFT_LAYERS, DRAFT_BLOCK_SIZE)
    save_draft(out, config, init_draft_weights(config, SEED + 1))
