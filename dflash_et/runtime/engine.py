"""The DFlash engine over the ExecuTorch programs: what `dflash generate` and the bench run.

Every limit comes from the programs' metadata (cache length, prefill chunk, EOS ids, mask token,
max block), so the engine needs nothing but the programs directory; programs without a draft (model.draft:
none) decode with lookup proposals alone. `block_size="auto"` adapts the
block to this device (`adaptive.py`, the C++ runner's planner): its cost curve comes from a file the bench wrote, or is
measured on first use, and what the planner learns carries over from one generation to the next.
"""

from dataclasses import asdict
from functools import cached_property
from pathlib import Path

from dflash_et.errors import ProgramError
from dflash_et.runtime.adaptive import AUTO, auto_planner, lookup_planner, plans
from dflash_et.runtime.cost_curve import CostCurve, measure_cost_curve
from dflash_et.runtime.generate import Generation, OnTokens, RoundPlanner, generate_ar, generate_dflash
from dflash_et.runtime.native import LookupPlanner, programs_identity
from dflash_et.runtime.programs import load_programs, max_block_len
from dflash_et.runtime.sampling import Sampler, Sampling

BlockSize = int | str  # a number of tokens (last token + proposals), or "auto"


def check_block_size(block_size: BlockSize, max_block_size: int, draft_name: str) -> BlockSize:
    """`block_size` as a number the draft takes (2..max_block_size), or auto."""
    if block_size == AUTO:
        return block_size
    if isinstance(block_size, str) and not block_size.isdigit():
        raise ValueError(f"block_size must be a number of tokens or auto, got {block_size!r}")
    block_size = int(block_size)
    if not 2 <= block_size <= max_block_size:
        raise ValueError(f"block_size {block_size} is outside 2..{max_block_size}, the blocks {draft_name} was "
                         "exported for (the draft's trained block unless export.max_block_size says otherwise); "
                         f"use block_size auto, or at most {max_block_size}")
    return block_size


def recommended(meta: dict, target_pte: Path, **overrides) -> Sampling:
    """The recommended sampling settings in target.pte's metadata `meta`, `overrides` on top."""
    if meta.get("temperature") is None:
        raise ProgramError(f"{target_pte} carries no recommended sampling settings (exported before "
                           "they were recorded); re-export it (dvc repro) or give the settings explicitly")
    return Sampling.from_metadata(meta, **overrides)


class Engine:
    def __init__(self, programs_dir: Path, cost_curve: Path | None = None):
        self.target, self.draft = load_programs(programs_dir)
        t = self.target.meta
        self.max_context_len, self.chunk, self.eos_ids = t.max_context_len, t.max_seq_len, set(t.eos_ids)
        self.mask_token_id = self.draft.meta.mask_token_id if self.draft else None
        self.max_block_size = max_block_len(self.target, self.draft)
        self._curve = CostCurve.load(cost_curve, self.identity) if cost_curve else None
        self._planner: RoundPlanner | None = None
        self._lookup_planner: LookupPlanner | None = None

    @cached_property
    def identity(self) -> str:
        """Which programs these are, for a cost curve measured on them."""
        d = self.draft  # none: 0 for its fingerprint and size, as the C++ runner's Pair
        return programs_identity([self.target.meta.checkpoint_id, d.meta.draft_checkpoint_id if d else 0,
                                  self.max_context_len, self.max_block_size, self.target.path.stat().st_size,
                                  d.path.stat().st_size if d else 0])

    def check_block_size(self, block_size: BlockSize) -> BlockSize:
        return check_block_size(block_size, self.max_block_size, (self.draft or self.target).path.name)

    def cost_curve(self, repeats: int = 5) -> CostCurve:
        """This device's cost per program call: the one the engine was given, or measured now (once)."""
        if self._curve is None:
            self._curve = self.measure_cost_curve(repeats)
        return self._curve

    def measure_cost_curve(self, repeats: int) -> CostCurve:
        """A new measurement of the cost per program call (it writes into the programs' caches: not mid-generation)."""
        return measure_cost_curve(self.target, self.draft, self.max_block_size, self.max_context_len, self.mask_token_id,
                                  self.chunk, repeats, self.identity)

    def planner(self) -> RoundPlanner:
        """The planner of greedy generations, learning across them."""
        if self._planner is None:
            self._planner = auto_planner(self.cost_curve(), self.max_block_size)
        return self._planner

    def lookup_planner(self) -> LookupPlanner:
        """The planner of lookup proposals in greedy generations at auto (with the draft or without), learning across
        them."""
        if self._lookup_planner is None:
            self._lookup_planner = lookup_planner(self.cost_curve(), self.max_block_size)
        return self._lookup_planner

    def recommended(self, **overrides) -> Sampling:
        """The checkpoint's recommended sampling settings (target.pte's metadata), `overrides` on top."""
        return recommended(asdict(self.target.meta), self.target.path, **overrides)

    def ar(self, prompt: list[int], max_new_tokens: int, on_tokens: OnTokens = None,
           sampler: Sampler | None = None) -> Generation:
        """Plain decoding with target.pte alone (greedy unless a sampler says otherwise): the baseline."""
        return generate_ar(self.target, prompt, max_new_tokens, self.eos_ids, self.max_context_len, self.chunk,
                           on_tokens, sampler)

    def dflash(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation:
        """DFlash decoding with target.pte verifying draft.pte's blocks (greedy unless a sampler says otherwise),
        at a fixed block (default: the largest draft.pte takes) or `auto` (greedy: lookup proposals take the rounds
        where they pay more than the draft's). Without a draft, the programs' proposals are lookup's (`lookup`)."""
        if self.draft is None:
            return self.lookup(prompt, max_new_tokens, block_size, on_tokens, sampler)
        block_size = self.check_block_size(block_size or self.max_block_size)
        sampler = sampler or Sampler()
        planned = plans(block_size, sampler.sampling.greedy)
        return generate_dflash(self.target, self.draft, prompt, max_new_tokens, self.eos_ids, self.max_context_len,
                               self.chunk, self.max_block_size if block_size == AUTO else block_size, self.mask_token_id,
                               on_tokens, sampler, self.planner() if planned else None,
                               self.lookup_planner() if planned else None)

    def lookup(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation:
        """Lookup proposals (native.lookup: what followed the context's longest recurring suffix) verified by
        target.pte, no draft call, at a fixed block (default: the largest the programs take) or `auto` (greedy: as
        many of each round's proposals as pay on this device's cost curve, none where they do not; sampled: the
        largest block)."""
        block_size = self.check_block_size(block_size or self.max_block_size)
        sampler = sampler or Sampler()
        planner = self.lookup_planner() if plans(block_size, sampler.sampling.greedy) else None
        return generate_dflash(self.target, None, prompt, max_new_tokens, self.eos_ids, self.max_context_len,
                               self.chunk, self.max_block_size if block_size == AUTO else block_size,
                               self.mask_token_id, on_tokens, sampler, lookup_planner=planner)

    def close(self) -> None:
        """Nothing to release (the programs go with the engine); here so that both engines close alike."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
