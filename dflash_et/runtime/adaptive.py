"""Adaptive verify length (`block_size: auto`): how many proposals each round drafts and verifies.

The planners are the C++ runner's (runner/host/planner.h for a draft's blocks, lookup.h for lookup proposals: their
headers say what each rule is and why), called through the host library (`native`), so that both runners make the
same choices and a rule changes in one place.
"""

from dflash_et.runtime import native
from dflash_et.runtime.cost_curve import CostCurve

AUTO = "auto"  # block_size: auto


def plans(block_size: int | str, greedy: bool) -> bool:
    """Whether a generation at `block_size` is planned round by round (greedy auto; planner.h says why)."""
    return block_size == AUTO and native.planned(True, greedy)


def auto_planner(curve: CostCurve, max_block: int, time_weight: float | None = None) -> native.Planner:
    """auto's planner over `curve` for drafts of at most `max_block` tokens; it learns across generations.
    `time_weight` 0 plans by the curve alone (the default also follows the rounds' wall times)."""
    return native.adaptive_planner(curve.in_library, max_block, time_weight)


def lookup_planner(curve: CostCurve, max_block: int) -> native.LookupPlanner:
    """auto's planner of lookup proposals (runner/host/lookup.h) over `curve`, for blocks of at most `max_block`
    tokens; it learns across generations."""
    return native.LookupPlanner(curve.in_library, max_block)
