"""The built-in tiny targets (of each family with a `Builtin`: Qwen3, Gemma 4, Qwen3.5) and a z-lab-layout DFlash draft.

Model hubs are not always reachable (CI, air-gapped build hosts), yet every stage must run
end to end. So the project writes its own pair, deterministically (fixed seeds, fixed
corpus), in exactly the file layout of the real checkpoints (`Qwen/Qwen3-4B` with
`z-lab/Qwen3-4B-DFlash-b16`; `google/gemma-4-31B-it` with `z-lab/gemma-4-31B-it-DFlash`):
downstream code then has a single path for both.
"""

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

from dflash_et.checkpoints import families, zlab
from dflash_et.checkpoints.load import eos_ids
from dflash_et.data.chat import encode_chat, reply_text
from dflash_et.data.corpus import samples
from dflash_et.data.prompts import with_documents
from dflash_et.data.tool_chats import as_text, tool_chat
from dflash_et.threads import all_cores

SEED = 0
VOCAB_SIZE = 2048  # embedding rows; like Qwen3, more than the tokenizer has
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK, MASK = "<think>", "</think>", "<|mask|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, THINK, END_THINK, MASK]

# Qwen3's template, reduced to what a chat needs: roles, a generation prompt, the empty think block that
# `enable_thinking=False` inserts, and tools: their declarations in the system turn, an assistant's calls and the
# tools' results as a user turn (data.tool_chats teaches them); Qwen3's own system text about tools, shortened to
# leave room in a small context. Calls are written in one of `CALLS`' formats: Qwen3's Hermes JSON (the built-in
# pair's), or Qwen3.5's XML (the built-in hybrid's), each with the line that tells the model how.
TOOLS_INTRO = "# Tools\n\nYou may call these functions:\n<tools>"
CALLS = {
    "hermes": ("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
               "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
               "{{- call.arguments if call.arguments is string else call.arguments | tojson }}"
               "{{- '}\\n</tool_call>' }}"),
    "xml": ("<tool_call>\n<function=function-name>\n<parameter=parameter-name>\nvalue\n</parameter>\n</function>\n"
            "</tool_call>",
            "{{- '<tool_call>\\n<function=' + call.name + '>\\n' }}{%- for key, value in call.arguments.items() %}"
            "{{- '<parameter=' + key + '>\\n' + (value if value is string else value | tojson) }}"
            "{{- '\\n</parameter>\\n' }}"
            "{%- endfor %}{{- '</function>\\n</tool_call>' }}"),
}
TOOLS_OUTRO = "\n</tools>\n\nTo call one, reply with " + CALLS["hermes"][0]


def qwen_template(calls: str = "hermes") -> str:
    """The built-in Qwen template, its calls in the `calls` format of CALLS."""
    how, call = CALLS[calls]
    return (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
        "{{- " + json.dumps(TOOLS_INTRO) + " }}{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
        "{{- " + json.dumps("\n</tools>\n\nTo call one, reply with " + how) + " + '<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- elif not (tools and loop.first and message.role == 'system') %}"
        "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
        "{%- for call in message.tool_calls or [] %}"
        "{%- set call = call.function if call.function is defined else call %}"
        "{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}"
        + call +
        "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
    )


CHAT_TEMPLATE = qwen_template()

DEFAULT_FAMILY = "qwen3"  # the built-in pair's target; the others are targets only (see families/)
TARGET_SHAPE = families.REGISTRY[DEFAULT_FAMILY].builtin.shape
DRAFT_LAYERS = 2
DRAFT_BLOCK_SIZE = 16
FAMILIES = tuple(families.builtins())  # write_target's families
# fetch's names for the other families' built-in targets (model.target: builtin-gemma, ...)
TARGET_SOURCES = {f.builtin.source: name for name, f in families.builtins().items() if f.builtin.source}


def build_tokenizer(special_tokens: list[str] = SPECIAL_TOKENS, eos: str = IM_END, pad: str = ENDOFTEXT,
                    chat_template: str = CHAT_TEMPLATE, vocab_size: int = VOCAB_SIZE,
                    split: str | None = None, calls: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the project's corpus, so any text round-trips. The defaults make the built-in
    target's (GPT-2's split); families and tests make others (other special tokens, no mask, `calls`: the built-in
    template with calls in another of CALLS' formats, or `split`: a regex that splits the text instead, byte-level
    coding it whole, as Qwen's and Llama 3's tokenizers do)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [f"{prompt}\n{answer}" for _, prompt, answer in samples(3000, seed=SEED)]
    rng = random.Random(SEED)
    for messages, tools, reply in (tool_chat(rng) for _ in range(1500)):
        text.append("\n".join([TOOLS_INTRO, *map(json.dumps, tools), TOOLS_OUTRO, *(m["content"] for m in messages),
                               as_text(reply)]))
    tok.train_from_iterator(text, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=pad,
        chat_template=qwen_template(calls) if calls else chat_template,
        model_max_length=TARGET_SHAPE["max_position_embeddings"],
    )


def _new_target(family: str, shape: dict | None) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, list[int], int]:
    """An untrained target of `family`, its tokenizer, EOS ids (the end of a turn and of the text) and pad id."""
    if family not in FAMILIES:
        raise ValueError(f"no built-in target of family {family!r}; families with one: {FAMILIES}")
    made = families.REGISTRY[family].builtin
    tokenizer = build_tokenizer(**made.tokenizer)
    config, eos, pad = made.config(tokenizer, {"vocab_size": VOCAB_SIZE, **made.shape, **(shape or {})})
    torch.manual_seed(SEED)
    return made.model(config), tokenizer, eos, pad


# What the real families' generation_config.json recommend, so the built-in targets carry sampling settings as
# real checkpoints do
RECOMMENDED_SAMPLING = {name: f.builtin.sampling for name, f in families.builtins().items()}


def write_target(out: Path, trained: bool = True, shape: dict | None = None, training: dict | None = None,
                 family: str = DEFAULT_FAMILY) -> None:
    """Write a built-in target of `family` (see FAMILIES): config, generation config, safetensors, tokenizer.

    `trained`: the default built-in target is a small LM trained here on the project's corpus, so
    its greedy replies follow the corpus and a draft can learn them; untrained, it is random
    weights in the same layout (seconds instead of minutes, for tests). `shape` and `training`
    override parts of the family's shape and TARGET_TRAINING (tests make a smaller trained target).
    """
    model, tokenizer, eos, pad = _new_target(family, shape)
    if trained:
        train_target(model, tokenizer, {**TARGET_TRAINING, **(training or {})})
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=eos, pad_token_id=pad,
                                               do_sample=True, **RECOMMENDED_SAMPLING[family])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# Training runs in two phases, as a real LLM's: `steps` on short corpus chats, then `long_steps` more (at `long_lr`)
# that each add one long chat, a question after a document of other corpus samples (data.prompts.with_documents,
# as the bench's `long` prompts are made) of 256..`long_tokens` tokens, its loss on the reply alone. Trained on
# short chats alone, it replies to a long prompt with a token or two (docs/measurements.md#long-context). With
# `tool_batch`, every step of both also adds that many tool-calling chats (data.tool_chats), their loss on the whole
# chat (on the reply alone, a small target writes names no declaration has). The default target learns none: 4 a
# step cost its draft a third of its acceptance (docs/measurements.md#tool-calls); the tests' target learns them.
TARGET_TRAINING = dict(steps=400, batch=32, lr=3e-3, warmup=20, samples=4000, seed=SEED + 2, long_steps=100,
                       long_lr=1e-3, long_batch=16, long_tokens=4096, tool_batch=0)


def _chat(tokenizer: PreTrainedTokenizerFast, prompt: str | list[dict], answer: str,
          tools: list[dict] | None = None) -> tuple[list[int], int]:
    """A chat (one user prompt, or messages) rendered as a generation prompt plus a reply ending with the
    tokenizer's EOS (the end of a turn), and where the reply starts."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    head = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
    return tokenizer.encode(head + answer + tokenizer.eos_token + "\n"), len(tokenizer.encode(head))


def _loss(model: PreTrainedModel, batch: list[tuple[list[int], int]], from_reply: bool) -> torch.Tensor:
    """Next-token loss over a padded batch of chats, on whole chats or (`from_reply`) on their replies only."""
    length = max(len(seq) for seq, _ in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    labels = torch.full((len(batch), length), -100)
    for i, (seq, reply) in enumerate(batch):
        first = reply if from_reply else 0
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, first:len(seq)] = ids[i, first:len(seq)]
    return model(input_ids=ids, labels=labels).loss


def _descend(model: PreTrainedModel, steps: int, lr: float, warmup: int, loss: Callable[[], torch.Tensor],
             desc: str) -> None:
    """`steps` AdamW steps on `loss()`: a linear warmup, then a cosine to 0."""
    from tqdm import tqdm

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    for _ in tqdm(range(steps), desc=desc):
        value = loss()
        opt.zero_grad()
        value.backward()
        opt.step()
        schedule.step()


@all_cores()
def train_target(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, t: dict = TARGET_TRAINING) -> None:
    """Next-token training on corpus (and tool-calling) chats, then on long ones too (see TARGET_TRAINING)."""
    corpus = samples(t["samples"], seed=t["seed"])
    chats = [_chat(tokenizer, prompt, answer) for _, prompt, answer in corpus]
    texts = [f"{prompt}\n{answer}" for _, prompt, answer in corpus]
    rng = random.Random(t["seed"])
    asked = (tool_chat(rng) for _ in range(t["samples"] // 4 if t["tool_batch"] else 0))
    tool_chats = [_chat(tokenizer, messages, reply_text(tokenizer, messages, reply, tools), tools)
                  for messages, tools, reply in asked]
    gen = torch.Generator().manual_seed(t["seed"])

    def tools() -> torch.Tensor | float:
        if not t["tool_batch"]:
            return 0.0
        picks = torch.randint(0, len(tool_chats), (t["tool_batch"],), generator=gen).tolist()
        return _loss(model, [tool_chats[i] for i in picks], from_reply=False)

    def short(n: int) -> list[tuple[list[int], int]]:
        return [chats[i] for i in torch.randint(0, len(chats), (n,), generator=gen).tolist()]

    def long_chat() -> tuple[list[int], int]:
        i, first, tokens = (int(torch.randint(0, n, (1,), generator=gen)) for n in
                            (len(corpus), len(texts), t["long_tokens"] - 256 - 64))
        document = (texts[first:] + texts[:first])[:t["long_tokens"] // 8]
        [prompt] = with_documents([corpus[i][1]], document, [256 + tokens], lambda p: len(encode_chat(tokenizer, p)))
        return _chat(tokenizer, prompt, corpus[i][2])

    model.train()
    _descend(model, t["steps"], t["lr"], t["warmup"],
             lambda: _loss(model, short(t["batch"]), from_reply=False) + tools(), "training the built-in target")
    if t["long_steps"]:
        _descend(model, t["long_steps"], t["long_lr"], t["warmup"],
                 lambda: _loss(model, short(t["long_batch"]), False) + _loss(model, [long_chat()], True) + tools(),
                 "training the built-in target on long chats")
    model.eval()


def write_draft(out: Path, target_dir: Path) -> None:
    """Write the built-in (random) draft in z-lab's layout for the target in `target_dir`."""
    target = json.loads((target_dir / "config.json").read_text())
    mask = zlab.choose_mask_token(target_dir, target["vocab_size"], eos_ids(target_dir))
    config = zlab.draft_config(target, mask, DRAFT_LAYERS, DRAFT_BLOCK_SIZE)
    zlab.save_draft(out, config, zlab.init_draft_weights(config, SEED + 1))
