"""Decoding, plain and DFlash, greedy or sampled, over any target/draft callables.

The loops take the models as callables with the programs' signatures, so the very same code
drives the eager PyTorch modules (the reference) and the ExecuTorch programs (the product):

    target(tokens [1,T], input_pos [T]) -> (logits [1,T,V], taps [1,T,k*H])
    draft(tokens [1,B], hidden [1,n,k*H], input_pos [n]) -> logits [1,B-1,V]   (.context_window: int | None)
                                      or [1,B-1,N] over the tokens .vocab_ids (a reduced head)
                                      or, .returns_lattice, a DFlash2 draft's (candidates, unary, pair)

A DFlash round: the draft proposes B-1 tokens after `last`; the target verifies
`[last] + proposals` in one call; the sampler accepts a prefix of the proposals (greedy: the
longest that matches the target's own argmax; sampled: the speculative-sampling rule, see
`sampling.py`) and adds the target's next token. A DFlash2 draft's proposals are its path through its
candidate lattice (greedy, or drawn for sampled proposals: `Sampler.walk`). Rejected positions need no undo: the next
target call simply writes its K/V over them. The draft is fed only the taps
of tokens it has not seen yet, so its context cache grows across rounds. A draft with a
`context_window` (every layer windowed; the exported ones take no more) is not fed taps
it would never read: those older than the block's first position minus window - 1.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from dflash_et.runtime.native import History, LookupPlanner
from dflash_et.runtime.sampling import Lattice, Sampler

TargetFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
DraftFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]
OnTokens = Callable[[list[int]], None] | None  # called with each batch of newly emitted tokens (streaming)


class RoundPlanner(Protocol):
    """Chooses each round's block and how many proposals to verify (`adaptive.auto_planner`; runner/host's
    RoundPlanner, whose hooks these are)."""

    def block(self, pos: int, room: int) -> int: ...  # the draft block (1: a plain step), at most room
    def verify_count(self, draft_logits: torch.Tensor, pos: int) -> int: ...  # proposals to verify
    def observe(self, verified: int, accepted: int) -> None: ...  # what the target accepted


@dataclass
class Round:
    """One decode step: a DFlash round, or one plain token (verified = 0). `drafted`: the proposals the
    draft (or lookup) made, of which the first `verified` went to the target (fewer under `block_size: auto`)."""

    verified: int
    accepted: int
    emitted: int
    draft_s: float
    verify_s: float
    total_s: float
    drafted: int = 0
    looked_up: bool = False  # its proposals were lookup's (without a draft, or taken from it: auto)

    @property
    def host_s(self) -> float:
        return self.total_s - self.draft_s - self.verify_s


@dataclass
class Generation:
    tokens: list[int]
    prefill_s: float
    rounds: list[Round] = field(default_factory=list)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per round, bonus included (1.0 for plain decoding)."""
        return sum(r.emitted for r in self.rounds) / max(len(self.rounds), 1)

    @property
    def decode_s(self) -> float:
        return sum(r.total_s for r in self.rounds)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first (which prefill produces) per second of decoding."""
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else 0.0


def pooled_tau(runs: list[Generation]) -> float:
    """Tokens per round over several generations together (not the mean of their taus)."""
    rounds = [r for g in runs for r in g.rounds]
    return sum(r.emitted for r in rounds) / max(len(rounds), 1)


def _positions(start: int, length: int) -> torch.Tensor:
    return torch.arange(start, start + length, dtype=torch.long)


def _check_prompt(prompt: list[int], max_seq_len: int, max_new_tokens: int) -> None:
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    if len(prompt) > max_seq_len:
        raise ValueError(f"the prompt has {len(prompt)} tokens but max_seq_len is {max_seq_len}; "
                         "shorten the prompt or export with a larger export.max_seq_len")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")


def prefill(target: TargetFn, prompt: list[int], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the prompt in chunks of at most `chunk` tokens: (last position's logits [V], all taps [1,P,k*H])."""
    taps = []
    for i in range(0, len(prompt), chunk):
        piece = prompt[i:i + chunk]
        logits, hidden = target(torch.tensor([piece]), _positions(i, len(piece)))
        taps.append(hidden)
    return logits[0, -1], torch.cat(taps, dim=1)


def unread(window: int | None, first: int, block_start: int) -> int:
    """How many taps, from position `first` on, a draft with this context window never reads when its block starts
    at `block_start`: those more than window - 1 before it (none without a window)."""
    return 0 if window is None else max(block_start - window + 1 - first, 0)


def _cut_at_eos(tokens: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i + 1], True
    return tokens, False


def generate_ar(target: TargetFn, prompt: list[int], max_new_tokens: int, eos_ids: set[int],
                max_seq_len: int, prefill_chunk: int, on_tokens: OnTokens = None,
                sampler: Sampler | None = None) -> Generation:
    """Plain decoding, one target call per token: the baseline and the ground truth (greedy by default)."""
    _check_prompt(prompt, max_seq_len, max_new_tokens)
    sampler = sampler or Sampler()
    t0 = time.perf_counter()
    logits, _ = prefill(target, prompt, prefill_chunk)
    out = Generation([sampler.next_token(logits)], time.perf_counter() - t0)
    on_tokens and on_tokens(out.tokens[:])
    pos = len(prompt)  # position of out.tokens[-1], not yet written to the cache
    while len(out.tokens) < max_new_tokens and out.tokens[-1] not in eos_ids and pos < max_seq_len:
        t0 = time.perf_counter()
        logits, _ = target(torch.tensor([[out.tokens[-1]]]), _positions(pos, 1))
        t1 = time.perf_counter()
        out.tokens.append(sampler.next_token(logits[0, -1]))
        on_tokens and on_tokens(out.tokens[-1:])
        pos += 1
        out.rounds.append(Round(0, 0, 1, 0.0, t1 - t0, time.perf_counter() - t0))
    return out


class LogitProposals:
    """A draft's logits [1, B-1, V] (or over `vocab_ids`) as proposals: the planner reads its confidence from
    them, then the first k are drawn (greedy: each position's argmax)."""

    def __init__(self, drafted: torch.Tensor, sampler: Sampler, vocab_ids: torch.Tensor | None, vocab_size: int):
        self.scores, self.sampler, self.vocab_ids, self.vocab_size = drafted[0], sampler, vocab_ids, vocab_size

    def first(self, k: int) -> tuple[list[int], torch.Tensor | None]:
        """The first k proposals and their distributions q (None: greedy)."""
        return self.sampler.propose(self.scores[:k], self.vocab_ids, self.vocab_size) if k else ([], None)


class PathProposals:
    """A DFlash2 draft's lattice (candidates, unary, pair) as proposals: its path is walked whole (greedy, or drawn),
    its scores are the planner's confidence."""

    def __init__(self, drafted: tuple[torch.Tensor, ...], sampler: Sampler, vocab_ids: torch.Tensor | None,
                 vocab_size: int):  # vocab_ids: as LogitProposals' (the lattice's candidates are token ids already)
        self.path, self.q, self.scores = sampler.walk(Lattice(*drafted), vocab_size)

    def first(self, k: int) -> tuple[list[int], torch.Tensor | None]:
        return self.path[:k], None if self.q is None else self.q[:k]


def generate_dflash(target: TargetFn, draft: DraftFn | None, prompt: list[int], max_new_tokens: int,
                    eos_ids: set[int], max_seq_len: int, prefill_chunk: int, block_size: int,
                    mask_token_id: int | None, on_tokens: OnTokens = None, sampler: Sampler | None = None,
                    planner: RoundPlanner | None = None, lookup_planner: LookupPlanner | None = None) -> Generation:
    """DFlash decoding: greedy, it emits exactly the tokens `generate_ar` would; sampled, tokens with
    exactly the distribution `generate_ar` samples from (greedy by default).

    Each round's block is clamped so that it never writes past `max_seq_len` nor emits more
    than `max_new_tokens`; a block of one is a plain target step (the draft is skipped and its
    unseen context carried to the next round). With a `planner` (`block_size: auto`) each round's block,
    up to `block_size`, and how many of its proposals to verify are the planner's choice. Without a `draft` the
    proposals are lookup proposals (`native.lookup`: what followed the context's longest recurring suffix), point
    masses the verify rule takes as argmax proposals, up to block_size - 1 a round and none where nothing recurs; a
    `lookup_planner` (`adaptive.lookup_planner`) then says how many of them to verify. With a draft, its `planner`
    and a `lookup_planner` (greedy auto), lookup proposals take the rounds where they pay more than the one planned.
    """
    _check_prompt(prompt, max_seq_len, max_new_tokens)
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2 (one anchor + one proposal), got {block_size}")
    sampler = sampler or Sampler()
    t0 = time.perf_counter()
    logits, taps = prefill(target, prompt, prefill_chunk)
    out, vocab_size = Generation([sampler.next_token(logits)], time.perf_counter() - t0), logits.shape[-1]
    on_tokens and on_tokens(out.tokens[:])
    pos = len(prompt)                     # position of out.tokens[-1], not yet written to the cache
    unseen, unseen_start = [taps], 0      # target taps the draft has not been fed, from unseen_start
    history = History(prompt + out.tokens, min(max_new_tokens, max_seq_len))  # what lookup reads
    window = getattr(draft, "context_window", None)
    vocab_ids = getattr(draft, "vocab_ids", None)  # a reduced head's logits are those of these tokens
    read = PathProposals if getattr(draft, "returns_lattice", False) else LogitProposals
    done = out.tokens[-1] in eos_ids
    while not done:
        room = min(block_size, max_new_tokens - len(out.tokens), max_seq_len - pos)
        if room < 1:
            break
        t0 = time.perf_counter()
        b = planner.block(pos, room) if planner else room
        last, proposals, q, draft_s, made = out.tokens[-1], [], None, 0.0, b - 1  # made: proposals made
        looked_up = draft is None
        if room >= 2 and (looked_up or lookup_planner):
            found, ngram = history.lookup(room - 1)
            if looked_up:
                count = lookup_planner.verify_count(ngram, len(found), pos) if lookup_planner and found else len(found)
                proposals, made = found[:count], len(found)
            elif found and (count := lookup_planner.take(planner, ngram, len(found), pos)):
                proposals, made, looked_up = found[:count], len(found), True
        if b >= 2 and not looked_up:
            hidden = torch.cat(unseen, dim=1)
            skip = unread(window, unseen_start, pos)
            hidden, unseen_start = hidden[:, skip:], unseen_start + skip
            block, context = torch.tensor([[last] + [mask_token_id] * (b - 1)]), _positions(unseen_start, hidden.shape[1])
            t1 = time.perf_counter()
            drafted = draft(block, hidden, context)
            draft_s = time.perf_counter() - t1
            proposed = read(drafted, sampler, vocab_ids, vocab_size)
            proposals, q = proposed.first(planner.verify_count(proposed.scores, pos) if planner else b - 1)
            unseen, unseen_start = [], pos
        tokens, positions = torch.tensor([[last] + proposals]), _positions(pos, len(proposals) + 1)
        t1 = time.perf_counter()
        logits, taps = target(tokens, positions)
        verify_s = time.perf_counter() - t1
        accepted, following = sampler.verify(proposals, q, logits[0])
        if looked_up:
            lookup_planner and lookup_planner.observe(len(proposals), accepted)
            planner and planner.taken(accepted)
        else:
            planner and planner.observe(len(proposals), accepted)
        new, done = _cut_at_eos(proposals[:accepted] + [following], eos_ids)
        out.tokens += new
        on_tokens and on_tokens(new)
        if draft is not None:
            unseen.append(taps if accepted == len(proposals) else taps[:, :accepted + 1])  # of `last`, the accepted
        history.extend(new)
        pos += accepted + 1
        out.rounds.append(Round(len(proposals), accepted, len(new), draft_s, verify_s, time.perf_counter() - t0,
                                made, looked_up))
    return out
