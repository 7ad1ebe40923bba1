"""The cost curve `block_size: auto` decides by: milliseconds per program call on one device, by call size and
cache position, timed in decoding rounds as decoding runs them (`measure_cost_curve`), or read from the bench
stage's reports/cost_curve.json (`CostCurve.load`). runner/src/planner.cpp reads the same file."""

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from dflash_et.errors import UserError
from dflash_et.runtime.generate import generate_dflash
from dflash_et.runtime.sampling import Sampler, argmax


@dataclass
class CostCurve:
    """Milliseconds per program call on one device, at a few cache positions (interpolated between)."""

    positions: list[int]
    target_ms: list[list[float]]  # [position][T - 1]: a target call of T = 1..max_block tokens
    draft_ms: list[list[float]]   # [position][B - 2]: a draft call with a block of B = 2..max_block
    programs: str = ""            # which programs were timed (`Engine.identity`)
    confidence_ms: float = 0.0    # reading the draft's confidence in a block of max_block (`confidence`)

    @property
    def max_block(self) -> int:
        return len(self.target_ms[0])

    def target(self, tokens: int, pos: int) -> float:
        return float(np.interp(pos, self.positions, [row[tokens - 1] for row in self.target_ms]))

    def draft(self, block: int, pos: int) -> float:
        return float(np.interp(pos, self.positions, [row[block - 2] for row in self.draft_ms]))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path, programs: str) -> "CostCurve":
        """The curve in `path` (the bench stage's cost_curve.json), checked to be of `programs`."""
        try:
            curve = cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise UserError(f"{path} is not a cost curve ({e}); the bench stage writes one "
                            "(reports/cost_curve.json), or leave it out to measure one at load") from None
        if curve.programs != programs:
            raise UserError(f"{path} was measured on other programs than these; rerun the bench stage for them, "
                            "or leave it out to measure one at load")
        return curve


def confidence(draft_logits: torch.Tensor) -> list[float]:
    """The draft's probability of its top token at each position of its logits [n, V]."""
    return draft_logits.float().softmax(-1).amax(-1).tolist()


def _typical(times: dict[int, list[float]]) -> list[float]:
    """Per length, the mean of the middle half of its rounds (what decoding meets; steadier than the median:
    on this project's VM the ratio of neighbouring blocks' costs varies by 2-3% between curves, 2-4% by
    the median, 8-9% by the fastest), then no length dearer than a longer one."""
    middle = np.array([np.mean(sorted(v)[len(v) // 4:len(v) - len(v) // 4]) for v in times.values()])
    return np.minimum.accumulate(middle[::-1])[::-1].tolist()


class _Sweep:
    """A planner that runs `per_block` rounds of each block B = max_block..1 (or 1..max_block), verifying
    every proposal, then plain steps; it times reading the draft's confidence in the largest block."""

    def __init__(self, max_block: int, per_block: int, descending: bool):
        order = range(max_block, 0, -1) if descending else range(1, max_block + 1)
        self.blocks = [b for b in order for _ in range(per_block)]
        self.rounds, self.max_block, self.confidence_ms = 0, max_block, []

    def block(self, pos: int, room: int) -> int:
        self.rounds += 1
        return min(self.blocks[self.rounds - 1], room) if self.rounds <= len(self.blocks) else 1

    def verify_count(self, draft_logits: torch.Tensor, pos: int) -> int:
        if draft_logits.shape[0] == self.max_block - 1:
            t0 = time.perf_counter()
            confidence(draft_logits)
            self.confidence_ms.append(1000 * (time.perf_counter() - t0))
        return draft_logits.shape[0]

    def observe(self, verified: int, accepted: int) -> None:
        pass


class _AcceptNone(Sampler):
    """Greedy verification (its host work) that accepts no proposal: each round moves one position on."""

    def verify(self, proposals: list[int], q: torch.Tensor | None, logits: torch.Tensor) -> tuple[int, int]:
        return 0, argmax(logits)[0]


def measure_cost_curve(target, draft, max_block: int, max_seq_len: int, mask_token_id: int, prefill_chunk: int,
                       repeats: int = 5, starts: list[int] | None = None) -> CostCurve:
    """Time the draft and target calls of decoding rounds with a block of B = 1..max_block (B = 1: a plain
    step), run by `generate_dflash` itself, at the start, middle and end of the cache: rounds as decoding
    runs them, host work between the calls included, cost what isolated calls do not (on this project's
    VM, block 16 against block 12: 2-29% dearer in isolated calls, from one measurement to the next, and
    16-25% in decoding; block 13 against 12: 0-21% and 10-21%). Each sweep runs three rounds of every
    block back to back (the same shapes repeat in decoding) and keeps the last two, over `repeats` sweeps
    (`_typical`).

    `starts`: the positions sweeps start at (default: the cache's start, middle and end), each measured at its
    sweep's mean position. It writes into both programs' caches: call it before a generation, whose prefill
    overwrites them."""
    per_block = max(1, min(3, (max_seq_len - 1) // max_block))  # fewer in a cache too small for three
    span = per_block * max_block  # positions a sweep moves on, one per round; descending, its blocks fit in them
    # Sweeps alternate the order where the cache has room for an ascending one (its last block ends `max_block`
    # past the span): each block is then timed at the same mean position (cost grows with it: descending
    # only, block 16 would be timed 12 positions before block 12, 1.6% cheaper on the built-in pair).
    both = max_seq_len - span - max_block >= 1
    last = max(max_seq_len - span - both * max_block, 1)
    positions = sorted(starts or {min(64, last), last // 2 or 1, last})
    if positions[0] < 1 or positions[-1] > last:
        raise UserError(f"cost curve sweeps start at 1..{last} in a cache of {max_seq_len}, not at {positions}")
    target_ms, draft_ms, c_ms = [], [], []
    for pos in positions:
        t_times = {t: [] for t in range(1, max_block + 1)}
        d_times = {b: [] for b in range(2, max_block + 1)}
        for sweep in range(repeats + 1):  # the first sweep warms up and is dropped
            plan = _Sweep(max_block, per_block, descending=not both or sweep % 2 == 1)
            out = generate_dflash(target, draft, [0] * pos, span + both * max_block + 1, set(), max_seq_len,
                                  prefill_chunk, max_block, mask_token_id, sampler=_AcceptNone(), planner=plan)
            for i, (b, r) in enumerate(zip(plan.blocks, out.rounds)):
                if sweep and (i % per_block or per_block == 1):
                    t_times[b].append(1000 * r.verify_s)
                    b > 1 and d_times[b].append(1000 * r.draft_s)
            c_ms += plan.confidence_ms if sweep else []
        target_ms.append(_typical(t_times))
        draft_ms.append(_typical(d_times))
    return CostCurve([p + span // 2 for p in positions], target_ms, draft_ms,
                     confidence_ms=float(np.median(c_ms)) if c_ms else 0.0)
