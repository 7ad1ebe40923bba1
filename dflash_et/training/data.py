"""A draft's training data: the prompts (the project's sets, long ones after a document, and those the target
writes itself: training.synthesize) and the target's own greedy replies to them, with the taps the draft reads.

The replies come from a decode loop that refills finished rows (training.replies), and their taps from one forward
pass over prompt and reply (HF `hidden_states[i + 1]` is layer i's output, as in the target program). The taps stay
on the training device, so a training step reads them without a copy from the host; a run's state keeps the token
ids alone (training.state), and a campaign's working copy its taps beside it (`cached_taps`), so a resumed session
taps only its new sequences."""

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from dflash_et.data.corpus import split_of
from dflash_et.data.prompts import PROMPT_SETS, builtin_prompts, document_texts, load_prompts, text_of, with_documents
from dflash_et.training.config import TrainConfig
from dflash_et.training.replies import decode

TRAIN_PROMPT_SEED = 4321
# Tokens a tap pass takes (sequences times the longest): every layer's hidden states of a pass are held at once, and
# SmolLM2's passes ran at 450 tokens/s at 3-6k tokens against 234 at 16k (docs/measurements.md)
TAP_TOKENS = 4096


@dataclass
class Sequence:
    tokens: torch.Tensor          # [L] prompt + the target's greedy response (on the host)
    taps: torch.Tensor            # [L-1, k*H] the target's taps (the last token's is never seen: no
    prompt_len: int               # anchor lies past it, and generation never feeds it), on the training device


def reply_model(target_dir: Path, device: torch.device, dtype: torch.dtype = torch.float32):
    """The target as transformers runs it, on `device`, in `dtype` (training.config.compute_dtype: fp32, the
    replies the fp32 programs give, or bf16 where the hardware runs it fast: a draft learns the target's habits, and
    a reply that parts from fp32 greedy decoding at a near-tie is still one the target would give)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()


def target_sequences(model, layer_ids: list[int], prompts: list[list[int]], max_new_tokens: int, eos: set[int],
                     batch: int = 16, taps_dtype: torch.dtype = torch.float32, deadline: float | None = None,
                     log=print) -> list[Sequence]:
    """The target's own greedy continuation of each prompt (`target_replies`) with its taps (`tapped`), in the
    order given; with a `deadline`, only the prompts answered before it."""
    replies = target_replies(model, prompts, max_new_tokens, eos, batch, deadline, log)
    return tapped(model, layer_ids, [(prompts[i] + replies[i], len(prompts[i])) for i in sorted(replies)],
                  taps_dtype=taps_dtype)


def target_replies(model, prompts: list[list[int]], max_new_tokens: int, eos: set[int], batch: int = 16,
                   deadline: float | None = None, log=print) -> dict[int, list[int]]:
    """{prompt index: the target's greedy reply, ending at its first end-of-turn token}, `batch` prompts decoded at
    a time (training.replies), ids alone: keeping every step's hidden states costs a sixth of the rate
    (docs/measurements.md), and the taps come cheaper from one prefill (`tapped`), which a resumed run needs anyway.
    Prompts go in by length; with a `deadline` (time.perf_counter), in a seeded random order, and none starts after
    it: the prompts answered are then a sample of all lengths."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    if deadline is not None:
        order = [order[i] for i in torch.randperm(len(order), generator=torch.Generator().manual_seed(0))]
    out = decode(model, prompts, order, max_new_tokens, eos, batch, lambda: past(deadline))
    if len(out) < len(prompts):
        log(f"[train_draft] replies to {len(out)} of {len(prompts)} prompts: the clock (train_draft.minutes) "
            "leaves the rest of the run to training")
    return out


def past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def tapped(model, layer_ids: list[int], sequences: list[tuple[list[int], int]], tokens: int = TAP_TOKENS,
           taps_dtype: torch.dtype = torch.float32) -> list[Sequence]:
    """Each (tokens, prompt length) with the target's taps at every position but the last (HF `hidden_states[i +
    1]` is layer i's output, as in the target program), from forward passes of about `tokens` tokens each
    (sequences sorted by length, right-padded: causal attention keeps the padding out of every real position), in
    the order given. The same sequences always meet in the same passes, so a resumed run recomputes the very taps."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    passes, picks = [], []
    for i in order:  # the longest sequence last in each pass: its width times the count stays near `tokens`
        if picks and (len(picks) + 1) * (len(sequences[i][0]) - 1) > tokens:
            passes, picks = passes + [picks], []
        picks.append(i)
    passes += [picks] if picks else []
    out: dict[int, Sequence] = {}
    with torch.no_grad(), tqdm(total=len(sequences), desc="[train_draft] target taps", unit="sequence") as bar:
        for picks in passes:
            width = len(sequences[picks[-1]][0]) - 1
            ids = torch.zeros(len(picks), width, dtype=torch.long)
            for row, i in enumerate(picks):
                ids[row, :len(sequences[i][0]) - 1] = torch.tensor(sequences[i][0][:-1])
            hidden = model.model(input_ids=ids.to(model.device), output_hidden_states=True,
                                 use_cache=False).hidden_states
            taps = torch.cat([hidden[i + 1] for i in layer_ids], dim=-1).to(taps_dtype)
            for row, i in enumerate(picks):
                tokens_i, prompt_len = sequences[i]
                out[i] = Sequence(torch.tensor(tokens_i), taps[row, :len(tokens_i) - 1].clone(), prompt_len)
            bar.update(len(picks))
    return [out[i] for i in range(len(sequences))]


def cached_taps(model, layer_ids: list[int], sequences: list[tuple[list[int], int]], cache: Path, key: str,
                taps_dtype: torch.dtype = torch.float32) -> list[Sequence]:
    """`tapped`, with the taps of the sequences `cache` already holds read from it rather than recomputed, and the
    file written anew with all of them when some were not. `cache` is one safetensors file, each sequence's taps
    under its ids' hash, valid for `key` (the target, its tap layers and the taps' dtype: another key, or a damaged
    file, is recomputed whole). A campaign's sessions keep adding replies, and tapping them all again took a third
    of a 90-minute CPU session (docs/measurements.md#a-draft-from-two-cpu-cores); the file stays in the working copy
    (gigabytes)."""
    names = [hashlib.sha256(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes()).hexdigest()[:32]
             for tokens, _ in sequences]
    known: dict[str, torch.Tensor] = {}
    try:
        with safe_open(cache, "pt") as f:
            if (f.metadata() or {}).get("key") == key:
                known = {name: f.get_tensor(name).to(model.device) for name in set(names) & set(f.keys())}
    except (OSError, SafetensorError):
        pass
    missing = sorted({i for i, name in enumerate(names) if name not in known})
    if missing:  # else the file holds them all already (gigabytes: writing it again costs a minute)
        for i, fresh in zip(missing, tapped(model, layer_ids, [sequences[i] for i in missing], taps_dtype=taps_dtype)):
            known[names[i]] = fresh.taps
        tmp = cache.with_name(f".{cache.name}.tmp")
        save_file({name: known[name].cpu().contiguous() for name in set(names)}, tmp, metadata={"key": key})
        os.replace(tmp, cache)
    return [Sequence(torch.tensor(tokens), known[name], prompt_len) for (tokens, prompt_len), name in zip(sequences, names)]


def training_prompts(config: TrainConfig) -> tuple[list[dict], list[dict]]:
    """(held-out rows, training rows). The project's prompt sets: training from the `train` split only and
    held-out from `eval`, the split validate and bench measure; a file: its first rows held out."""
    if config.prompts == "builtin":
        return (builtin_prompts(config.heldout, seed=TRAIN_PROMPT_SEED, split="eval"),
                builtin_prompts(config.num_prompts, seed=TRAIN_PROMPT_SEED, split="train"))
    if config.prompts in PROMPT_SETS:
        return (load_prompts(config.prompts, config.heldout, split="eval"),
                load_prompts(config.prompts, config.num_prompts, split="train"))
    rows = load_prompts(config.prompts, config.num_prompts + config.heldout)
    return rows[:config.heldout], rows[config.heldout:]


def is_measured(config: TrainConfig):
    """Whether a prompt's text is one validate and bench may measure on (the set's eval split; a file's held-out
    rows): a prompt the target writes itself that is one of them is dropped, so that no draft trains on it."""
    if config.prompts == "builtin":
        return lambda text: split_of(text) == "eval"
    rows = (load_prompts(config.prompts, 1 << 30, split="eval") if config.prompts in PROMPT_SETS
            else load_prompts(config.prompts, config.heldout))
    texts = {text_of(r["prompt"]).strip() for r in rows}
    return lambda text: text.strip() in texts


def long_rows(row_sets: list[list[dict]], share: float, texts: list[str], room: int, count) -> list[list[dict]]:
    """Each list of `row_sets`, `share` of its rows (evenly spread) asked after a document of `texts` as the bench's
    `long` prompts are (prompts.with_documents, one call for all the lists: each text counted once), their
    lengths in tokens (`count`) rising evenly to `room` in each list, each document starting at another text. A
    draft trained on short prompts alone stops accepting after a long one, even one the target answers as it
    would a short one (docs/measurements.md#long-context)."""
    picks = [[i for i in range(len(rows)) if int((i + 1) * share) > int(i * share)] for rows in row_sets]
    lengths = [room * (j + 1) // len(picked) for picked in picks for j in range(len(picked))]
    asked = iter(with_documents([rows[i]["prompt"] for rows, picked in zip(row_sets, picks) for i in picked],
                                texts, lengths, count, rotate=True))
    out = []
    for rows, picked in zip(row_sets, picks):
        out.append(list(rows))
        for i in picked:
            out[-1][i] = {**rows[i], "prompt": next(asked)}
    return out


def with_long_rows(config: TrainConfig, heldout: list[dict], train: list[dict], count) -> tuple[list[dict], list[dict]]:
    """`training_prompts`' rows with `config.long_prompts` of each asked after a document filling up to what
    `max_seq_len` leaves for the reply, of the set's train-split texts (prompts.document_texts; a file's: its
    training rows', so that no held-out question is in a document)."""
    if not 0 <= config.long_prompts <= 1:
        raise ValueError(f"train_draft.long_prompts={config.long_prompts} is a share of the prompts: give 0 to 1")
    if not config.long_prompts:
        return heldout, train
    room = config.max_seq_len - config.max_new_tokens
    texts = (document_texts(config.prompts, room) if config.prompts in PROMPT_SETS
             else [text_of(r["prompt"]) for r in train])
    heldout, train = long_rows([heldout, train], config.long_prompts, texts, room, count)
    return heldout, train


def fitting(prompts: list[list[int]], config: TrainConfig, name: str, log) -> list[list[int]]:
    """The prompts that leave room for a reply within `max_seq_len` (export.max_seq_len): the programs can decode
    no longer one, so the draft need not learn it; none left is refused in one line."""
    fits = [ids for ids in prompts if len(ids) + config.max_new_tokens <= config.max_seq_len]
    if not fits:
        raise ValueError(f"no {name} prompt of train_draft.prompts={config.prompts} fits export.max_seq_len="
                         f"{config.max_seq_len} with a {config.max_new_tokens}-token reply; raise export.max_seq_len "
                         "or use shorter prompts")
    if len(fits) < len(prompts):
        log(f"[train_draft] {len(prompts) - len(fits)} of {len(prompts)} {name} prompts left out: longer than "
            f"export.max_seq_len={config.max_seq_len} leaves room for with a {config.max_new_tokens}-token reply")
    return fits
