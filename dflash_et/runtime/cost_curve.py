"""The cost curve `block_size: auto` decides by: milliseconds per program call on one device, by call size and
cache position, timed in decoding rounds as decoding runs them (`measure_cost_curve`), or read from the bench
stage's reports/cost_curve.json (`CostCurve.load`). How it is measured, read, checked and interpolated is the C++
runner's (runner/host/cost_curve.h, through `native`): both runners plan by the same curve the same way."""

import json
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import torch

from dflash_et.runtime import native
from dflash_et.runtime.generate import generate_dflash
from dflash_et.runtime.sampling import Sampler, argmax


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds per program call on one device, at a few cache positions (interpolated between)."""

    positions: list[int]
    target_ms: list[list[float]]  # [position][T - 1]: a target call of T = 1..max_block tokens
    draft_ms: list[list[float]]   # [position][B - 2]: a draft call with a block of B = 2..max_block
    programs: str = ""            # which programs were timed (`Engine.identity`)
    confidence_ms: float = 0.0    # reading the draft's confidence in a block of max_block

    @property
    def max_block(self) -> int:
        return len(self.target_ms[0])

    @cached_property
    def in_library(self) -> native.Curve:
        """The curve in the host library, which interpolates it and plans by it (checked there as a file would be)."""
        return native.Curve.parse(json.dumps(self.to_dict()), "the cost curve given")

    def target(self, tokens: int, pos: int) -> float:
        return self.in_library.target(tokens, pos)

    def draft(self, block: int, pos: int) -> float:
        return self.in_library.draft(block, pos)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, curve: native.Curve) -> "CostCurve":
        made = cls(**json.loads(curve.json()))
        made.__dict__["in_library"] = curve  # the one it came from (cached_property's slot)
        return made

    @classmethod
    def load(cls, path: Path, programs: str) -> "CostCurve":
        """The curve in `path` (the bench stage's cost_curve.json), checked to be of `programs`."""
        return cls.of(native.Curve.load(path, programs))


class _AcceptNone(Sampler):
    """Greedy verification (its host work) that accepts no proposal: each round moves one position on."""

    def verify(self, proposals: list[int], q: torch.Tensor | None, logits: torch.Tensor) -> tuple[int, int]:
        return 0, argmax(logits)[0]


def _no_draft(block: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """The draft of a target without one (model.draft: none) in the sweep: proposals (token 0) that cost nothing,
    so that the target's verifies are timed as with a draft (runner/src/decode.cpp does the same)."""
    return torch.zeros(1, block.shape[1] - 1, 1)


def measure_cost_curve(target, draft, max_block: int, max_seq_len: int, mask_token_id: int | None,
                       prefill_chunk: int, repeats: int = 5, programs: str = "") -> CostCurve:
    """Time the draft and target calls of decoding rounds with a block of B = 1..max_block (B = 1: a plain
    step), run by `generate_dflash` itself, at the start, middle and end of the cache, as the runner's CostSweep
    plans them (runner/host/cost_curve.h says how and why); `repeats` sweeps of each after one to warm up. It writes
    into both programs' caches: call it before a generation, whose prefill overwrites them. Without a `draft`, its
    calls cost nothing."""
    draft, mask_token_id = (draft, mask_token_id) if draft is not None else (_no_draft, 0)
    sweep = native.CostSweep(max_block, max_seq_len, repeats)
    for i, start in enumerate(sweep.starts):
        for n in range(sweep.count):
            plan = sweep.planner(n)
            out = generate_dflash(target, draft, [0] * start, sweep.tokens, set(), max_seq_len, prefill_chunk,
                                  max_block, mask_token_id, sampler=_AcceptNone(), planner=plan)
            sweep.record(i, n, plan, [r.verify_s for r in out.rounds], [r.draft_s for r in out.rounds])
    return CostCurve.of(sweep.curve(programs))
