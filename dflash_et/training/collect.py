"""Collecting a run's data: the prompts (the set's, and those the target writes itself), the target's greedy
replies to them, and, when a campaign resumes with a larger `synthetic_prompts`, the prompts and replies it adds.
The state (training.state) is written as soon as the data grew: replies are the dearest part of a run on a CPU."""

import time
from pathlib import Path

from dflash_et.data.chat import encode_chat
from dflash_et.data.prompts import text_of
from dflash_et.models.draft import Draft
from dflash_et.training import state
from dflash_et.training.config import TrainConfig
from dflash_et.training.data import fitting, is_measured, target_replies, training_prompts, with_long_rows
from dflash_et.training.fit import Clock, sampler
from dflash_et.training.synthesize import synthesize_prompts, user_turn


def prompt_rows(config: TrainConfig, tok, model, log, deadline: float | None = None
                ) -> tuple[list[dict], list[dict], dict]:
    """(held-out rows, training rows, their counts): the prompt set's, then `synthetic_prompts` the target writes
    itself (`own_prompts`), then long rows as `long_prompts` asks."""
    heldout, train = training_prompts(config)
    synthetic = own_prompts(config, tok, model, log, deadline, config.synthetic_prompts, config.seed, heldout)
    counts = {"set": len(train), "synthetic": len(synthetic), "heldout": len(heldout),
              "synthetic_examples": [r["prompt"] for r in synthetic[:5]]}
    heldout, train = with_long_rows(config, heldout, train + synthetic, lambda p: len(encode_chat(tok, p)))
    return heldout, train, counts


def own_prompts(config: TrainConfig, tok, model, log, deadline: float | None, n: int, seed: int,
                heldout: list[dict]) -> list[dict]:
    """Up to `n` prompts the target writes itself from `seed`, none of them a held-out or measured one (none, in one
    logged line, when it has no chat template; no batch of them starts after `deadline`)."""
    if n and user_turn(tok) is None:
        log(f"[train_draft] the target has no chat template to write its own prompts with: training on "
            f"train_draft.prompts={config.prompts} alone")
    if not n or user_turn(tok) is None:
        return []
    measured = is_measured(config)
    written = synthesize_prompts(model, tok, n, seed, batch=config.generate_batch,
                                 exclude=[text_of(r["prompt"]) for r in heldout], log=log,
                                 deadline=deadline)
    synthetic = [r for r in written if not measured(r["prompt"])]
    if len(synthetic) < len(written):
        log(f"[train_draft] {len(written) - len(synthetic)} prompts the target wrote are measured prompts "
            "(validate's and bench's eval split): left out")
    return synthetic


def more_data(config: TrainConfig, saved: state.Saved, tok, model, eos: set[int], clock: Clock, log
              ) -> list[tuple[list[int], int]]:
    """A resumed run's new data: replies to the prompt set's training prompts the state has none for (a larger
    `num_prompts`, or those an earlier session's clock left unanswered), then, when `synthetic_prompts` asks for more
    than the state holds, to prompts the target writes from a seed of this session's own (none equal to a prompt
    already answered)."""
    counts = saved.progress.counts
    want = config.synthetic_prompts - counts.get("synthetic", 0)
    since = time.perf_counter()
    seed = config.seed + 1000 * (1 + len(saved.progress.sessions))  # a stream of its own, not the first run's
    heldout, train = training_prompts(config)
    rows = own_prompts(config, tok, model, log, clock.until(0.4 * config.data_share), want, seed, heldout) if want > 0 else []
    answered = {tuple(tokens[:p]) for tokens, p in saved.train}
    asked = fitting([encode_chat(tok, r["prompt"]) for r in train], config, "training", log)
    written = fitting([encode_chat(tok, r["prompt"]) for r in rows], config, "new", log) if rows else []
    fresh: dict[tuple, tuple[list[int], bool]] = {}  # prompt: (its ids, whether the target wrote it)
    for ids, own in [(ids, False) for ids in asked] + [(ids, True) for ids in written]:
        if tuple(ids) not in answered:
            fresh.setdefault(tuple(ids), (ids, own))
    prompts, own = [ids for ids, _ in fresh.values()], [o for _, o in fresh.values()]
    if not prompts:
        return []
    since = clock.add("synthesis", since)
    replies = target_replies(model, prompts, config.max_new_tokens, eos, config.generate_batch, clock.until(config.data_share), log)
    clock.add("replies", since)
    counts["set"] = max(counts.get("set", 0), len(train))
    counts["synthetic"] = counts.get("synthetic", 0) + sum(own[i] for i in replies)
    log(f"[train_draft] {len(replies)} new prompts and replies beside the {len(saved.train)} the run had")
    return [(prompts[i] + replies[i], len(prompts[i])) for i in sorted(replies)]


def new_data(config: TrainConfig, tok, model, eos: set[int], clock: Clock, log
             ) -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]], dict]:
    """A new run's data as (tokens, prompt length) pairs: the training prompts with the target's greedy replies, the
    held-out prompts with theirs (for block tau), and the prompts' counts. With `minutes`, the data stop at
    `data_share` of the run's clock (the prompts the target writes at 2/5 of it), and the rest trains."""
    since = time.perf_counter()
    heldout_rows, train_rows, counts = prompt_rows(config, tok, model, log, clock.until(0.4 * config.data_share))
    heldout = fitting([encode_chat(tok, r["prompt"]) for r in heldout_rows], config, "held-out", log)
    prompts = fitting([encode_chat(tok, r["prompt"]) for r in train_rows], config, "training", log)
    since = clock.add("synthesis", since)
    replies = target_replies(model, prompts, config.max_new_tokens, eos, config.generate_batch, clock.until(config.data_share), log)
    held = target_replies(model, heldout, config.max_new_tokens, eos, config.generate_batch)
    clock.add("replies", since)
    return ([(prompts[i] + replies[i], len(prompts[i])) for i in sorted(replies)],
            [(heldout[i] + held[i], len(heldout[i])) for i in range(len(heldout))], counts)


def collect(config: TrainConfig, saved: state.Saved | None, state_dir: Path | None, target_id: str, tok, model,
            eos: set[int], draft: Draft, clock: Clock, log) -> tuple[state.Saved, int]:
    """The run's data (a new run's, or the state's and what a larger `synthetic_prompts` adds to it), written to
    `state_dir` as soon as it grew; and how many sequences were there before this session."""
    if saved is None:
        train_ids, heldout_ids, counts = new_data(config, tok, model, eos, clock, log)
        saved = state.Saved(train_ids, heldout_ids, state.Progress(counts=counts),
                            state.trainer_tensors(draft, None, sampler(config)))
        had = 0
    else:
        if not saved.tensors:  # a clone with no draft of the campaign: new weights on the state's replies
            saved.tensors = state.trainer_tensors(draft, None, sampler(config))
            log(f"[train_draft] {state_dir} has no state.safetensors and no draft of it is at hand: new weights")
        log(f"[train_draft] resuming {state_dir} at step {saved.progress.step} of {config.steps} "
            f"({len(saved.train)} sequences)")
        had = len(saved.train)
        saved.train = saved.train + more_data(config, saved, tok, model, eos, clock, log)
    if state_dir is not None and len(saved.train) > had:  # replies are the dearest part: kept before the rest runs
        state.save(state_dir, config, target_id, saved)
    return saved, had
