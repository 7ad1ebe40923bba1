"""Training prompts a chat target writes itself ("data without a dataset"): its chat template opens a user turn,
the target samples the user's message (temperature about 1) until it ends the turn, and what it wrote becomes a
prompt. A draft then learns the target's replies to the questions the target itself finds likely, with no prompt
set to fetch or license. Empty, short, repetitive, unfinished and repeated messages are dropped, and so is any
held-out prompt, which must never be trained on. Seeded: the same target and settings give the same prompts."""

import math
import re
import time
from collections import Counter
from collections.abc import Collection, Iterable

from transformers import PreTrainedTokenizerBase

from dflash_et.data.chat import chat_format
from dflash_et.runtime.sampling import Sampling
from dflash_et.training.replies import decode

MIN_CHARS = 12  # fewer characters than "What is DNS?" ask for no reply worth learning
# Repetitive: a quarter or more of a message's token 4-grams repeat an earlier one. A loop through the same words
# k times tends to (k - 1) / k, and one sentence said twice reaches about 0.27 already; the project's own prompts reach
# 0.19 at most (code, and long words cut into many tokens by the built-in target's small vocabulary), where "one
# 4-gram 3 times" drops 8% of them: texts to summarize say " of the " and the like more often than that.
NGRAM, MAX_REPEATED = 4, 0.25


def user_turn(tok: PreTrainedTokenizerBase) -> tuple[list[int], list[int]] | None:
    """(ids that open a user turn, the id that ends one): the template's rendering of one user message as a fixed
    prefix and suffix (data.chat.chat_format), so the target writes the message exactly where a user's would be,
    and stops where it would hand over. None when the tokenizer has no chat template (its plain text marks no
    turn to stop at), the template is not one fixed prefix and suffix, or the suffix encodes to nothing."""
    if tok.chat_template is None:
        return None
    fmt = chat_format(tok)
    if fmt is None:
        return None
    end = tok.encode(fmt.suffix, add_special_tokens=False)
    if not end:
        return None
    return [*fmt.before, *tok.encode(fmt.prefix, add_special_tokens=False)], end[:1]


def rejection(ids: list[int], text: str, min_chars: int = MIN_CHARS, special: Collection[int] = ()) -> str | None:
    """Why a sampled user message (its `ids` before the end of the turn, and their `text`) is not kept as a training
    prompt, or None to keep it: "special" (one of the tokenizer's `special` ids inside it: the target opened another
    turn or role, which decoding would hide while keeping the text after it), "empty", "short" (under `min_chars`
    characters) or "repetitive" (MAX_REPEATED or more of its token NGRAM-grams repeat an earlier one). A small model
    at temperature 1 loops now and then; the target's replies to a loop teach the draft little about its replies to
    a user."""
    if any(i in special for i in ids):
        return "special"
    if not text.strip():
        return "empty"
    if len(text) < min_chars:
        return "short"
    grams = [tuple(ids[i:i + NGRAM]) for i in range(len(ids) - NGRAM + 1)]
    if grams and len(grams) - len(set(grams)) >= MAX_REPEATED * len(grams):
        return "repetitive"
    return None


def _key(text: str) -> str:
    """What two prompts that differ only in case or spacing share: one of them is enough."""
    return re.sub(r"\s+", " ", text).strip().lower()


def _eos(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def synthesize_prompts(model, tok: PreTrainedTokenizerBase, n: int, seed: int, *, batch: int = 16,
                       max_new_tokens: int = 96, temperature: float = 1.0, top_p: float = 0.95,
                       exclude: Iterable[str] = (), log=print, deadline: float | None = None) -> list[dict]:
    """Up to n rows {"category": "synthetic", "prompt": text} the target (`model` and its `tok`)
    wrote as user messages, in the order sampled; [] for a tokenizer without a chat template (user_turn). Samples
    of at most `max_new_tokens` tokens, `batch` decoded at a time (training.replies), at `temperature` and `top_p`,
    with no top-k (the checkpoint's own, Qwen3's 20 say, would narrow what it asks), until n are kept or 3n + `batch`
    were drawn: a target that seldom writes an acceptable message gives fewer, never an endless loop. Dropped: a
    message not ended within max_new_tokens ("truncated"), `rejection`'s, a repeat of a kept one ("duplicate"), and
    one of the `exclude` texts, the held-out prompts ("held-out"), compared lower-cased with whitespace collapsed.
    Sample i is drawn from `seed` and i alone, so the prompts do not depend on what ran before in the process. With a
    `deadline` (time.perf_counter), no sample is started past it once the first `batch` have been."""
    turn = user_turn(tok)
    if turn is None or n <= 0:
        return []
    opening, end = turn
    stops = list(dict.fromkeys(end + _eos(model)))
    held, special = {_key(text) for text in exclude}, set(tok.all_special_ids)
    seen, rows, dropped, drawn, limit = set(), [], Counter(), 0, 3 * n + batch
    sampling = Sampling(temperature=temperature, top_p=top_p)
    t0 = time.perf_counter()
    while len(rows) < n and drawn < limit and not (drawn and deadline is not None and time.perf_counter() > deadline):
        count = min(limit - drawn, max(batch, math.ceil(1.25 * (n - len(rows)))))
        samples = decode(model, [opening] * (drawn + count), list(range(drawn, drawn + count)), max_new_tokens,
                         set(stops), batch, lambda: deadline is not None and time.perf_counter() > deadline,
                         sampling, seed, desc="prompts the target writes")
        drawn += count
        for i in sorted(samples):
            if len(rows) >= n:
                break
            sample = samples[i]
            if sample[-1] not in stops:
                dropped["truncated"] += 1
                continue
            ids = sample[:-1]
            text = tok.decode(ids, skip_special_tokens=True).strip()
            key = _key(text)
            reason = rejection(ids, text, special=special) or ("held-out" if key in held else "duplicate" if key in seen else None)
            if reason:
                dropped[reason] += 1
                continue
            seen.add(key)
            rows.append({"category": "synthetic", "prompt": text})
    sampled = sum(dropped.values()) + len(rows)
    reasons = ", ".join(f"{reason} {count}" for reason, count in dropped.most_common()) or "none"
    log(f"[train_draft] synthesized {len(rows)} prompts from {sampled} samples (dropped: {reasons}) in "
        f"{time.perf_counter() - t0:.0f} s")
    return rows
