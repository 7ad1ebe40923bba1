"""How much faster is DFlash than plain decoding of the same target.pte, and is it still exact?

Plain decoding, DFlash at every fixed block in `block_sizes` and DFlash with `auto` blocks run
interleaved on the same prompts in one process (so drift in machine speed hits all alike), after
measuring this device's cost curve (which auto decides by) and a warm-up that is not counted.
Throughput is decode tokens per second (the first token comes from prefill, which all share). At temperature > 0 both sample with the
same settings (each run its own seed, the same for AR and DFlash), and tau and speedup are
measured exactly as for greedy decoding; "lossless" (token equality) is a greedy-only check.

Three steps: `collect` (bench_runs.py) runs every mode on every prompt into one `Runs`; each bench.json metric is a small
function of it, registered in METRICS (bench.json's order; `HEADLINE` the ones the stage prints), and each
plot's rows likewise in PLOTS (with its columns). A new metric or plot is one function here, nothing else.

(Over 300 lines: about thirty metrics and plots of a few lines each, registered where they are defined; the
registry is the module, so they stay in one.)
"""

import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from dflash_et.data.prompts import load_prompts
from dflash_et.evaluate.bench_runs import BenchConfig, Runs, collect, throughput
from dflash_et.runtime.adaptive import AUTO
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.decoder import RUNNERS, open_decoder
from dflash_et.runtime.engine import BlockSize
from dflash_et.runtime.generate import pooled_tau
from dflash_et.runtime.programs import missing_backend


def _ms(values: list[float]) -> float:
    return 1000 * sum(values) / max(len(values), 1)


# bench.json's metrics, in its order: name -> the value from one bench's runs (None: not reported for these runs)
METRICS: dict[str, Callable[[Runs], object]] = {}


def metric(f: Callable[[Runs], object]) -> Callable[[Runs], object]:
    METRICS[f.__name__] = f
    return f


def recorded(name: str, of: Callable[[Runs], object]) -> None:
    """A metric that says how the run was made (a setting, a count), not what it measured."""
    METRICS[name] = of


recorded("block_size", lambda runs: runs.block_size)
recorded("runner", lambda runs: runs.config.runner)  # the host loop that decoded: python or cpp
recorded("sampling", lambda runs: runs.settings.settings())


@metric
def tau(runs: Runs) -> float:
    """Tokens per round, bonus included, at block_size."""
    return pooled_tau(runs.pooled(runs.headline))


@metric
def speedup(runs: Runs) -> float:
    """DFlash decode tokens/s at block_size over plain decoding's."""
    return runs.speedup(runs.headline)


@metric
def ar_tokens_per_s(runs: Runs) -> float:
    return throughput(runs.pooled("ar"))


@metric
def dflash_tokens_per_s(runs: Runs) -> float:
    return throughput(runs.pooled(runs.headline))


@metric
def draft_ms_per_round(runs: Runs) -> float:
    return _ms([r.draft_s for r in runs.rounds(runs.headline)])


@metric
def verify_ms_per_round(runs: Runs) -> float:
    return _ms([r.verify_s for r in runs.rounds(runs.headline)])


@metric
def host_ms_per_round(runs: Runs) -> float:
    """Everything outside the two program calls."""
    return _ms([r.host_s for r in runs.rounds(runs.headline)])


@metric
def ar_ms_per_token(runs: Runs) -> float:
    return _ms([r.total_s for r in runs.rounds("ar")])


@metric
def lossless(runs: Runs) -> bool | None:
    """Greedy only: every DFlash output is plain decoding's."""
    return runs.lossless if runs.settings.greedy else None


recorded("prompts", lambda runs: runs.prompts)
recorded("repeats", lambda runs: runs.config.repeats)
recorded("rounds", lambda runs: len(runs.rounds(runs.headline)))


def _accepted(runs: Runs) -> list[int]:
    """Drafted rounds at block_size by proposals accepted, 0 .. max_block - 1."""
    count = Counter(r.accepted for r in runs.rounds(runs.headline) if r.drafted)
    return [count.get(k, 0) for k in range(runs.max_block)]


@metric
def plain_step_vs_cost_curve_by_category(runs: Runs) -> dict[str, float]:
    """Plain decoding's target calls over what the cost curve says a T=1 call costs at their positions: 1.0 when
    the curve auto plans by measures what decoding pays (each category's prompts are at their own depths)."""
    def ratio(category: str) -> float:
        paid = planned = 0.0
        for generations in (per_repeat[category] for per_repeat in runs.generations["ar"]):
            for g, length in zip(generations, runs.prompt_lengths[category]):
                paid += sum(1000 * r.verify_s for r in g.rounds)
                planned += sum(runs.curve.target(1, length + i) for i in range(len(g.rounds)))
        return paid / planned if planned else 0.0

    return {c: ratio(c) for c in runs.categories}


@metric
def acceptance_histogram(runs: Runs) -> dict[str, int]:
    return {str(k): n for k, n in enumerate(_accepted(runs))}


@metric
def tau_by_category(runs: Runs) -> dict[str, float]:
    return {c: pooled_tau(runs.pooled(runs.headline, c)) for c in runs.categories}


@metric
def speedup_by_category(runs: Runs) -> dict[str, float]:
    return {c: runs.speedup(runs.headline, c) for c in runs.categories}


@metric
def speedup_by_block(runs: Runs) -> dict[str, float]:
    return {b: runs.speedup(b) for b in runs.fixed}


@metric
def tau_by_block(runs: Runs) -> dict[str, float]:
    return {b: pooled_tau(runs.pooled(b)) for b in runs.fixed}


@metric
def speedup_by_block_by_category(runs: Runs) -> dict[str, dict[str, float]]:
    return {c: {b: runs.speedup(b, c) for b in runs.fixed} for c in runs.categories}


@metric
def speedup_range_over_repeats(runs: Runs) -> dict[str, list[float]]:
    return {mode: runs.spread(mode) for mode in runs.modes}


@metric
def speedup_range_over_repeats_by_category(runs: Runs) -> dict[str, dict[str, list[float]]]:
    return {c: {mode: runs.spread(mode, c) for mode in runs.modes} for c in runs.categories}


@metric
def block_sizes_skipped(runs: Runs) -> list[int] | None:
    return runs.too_large or None


@metric
def verify_cost_ratio(runs: Runs) -> float:
    """A target call of the largest block over one token's, at the start of the cache."""
    start = runs.curve.positions[0]
    return runs.curve.target(runs.max_block, start) / runs.curve.target(1, start)


@metric
def speedup_auto(runs: Runs) -> float:
    return runs.speedup(AUTO)


@metric
def tau_auto(runs: Runs) -> float:
    return pooled_tau(runs.pooled(AUTO))


def _mean_verify_tokens(runs: Runs, category: str | None = None) -> float:
    return statistics.fmean(r.verified + 1 for r in runs.rounds(AUTO, category))


@metric
def mean_verify_tokens_auto(runs: Runs) -> float:
    """Tokens per target call."""
    return _mean_verify_tokens(runs)


@metric
def speedup_auto_by_category(runs: Runs) -> dict[str, float]:
    return {c: runs.speedup(AUTO, c) for c in runs.categories}


@metric
def tau_auto_by_category(runs: Runs) -> dict[str, float]:
    return {c: pooled_tau(runs.pooled(AUTO, c)) for c in runs.categories}


@metric
def mean_verify_tokens_auto_by_category(runs: Runs) -> dict[str, float]:
    return {c: _mean_verify_tokens(runs, c) for c in runs.categories}


@metric
def auto_rounds_by_category(runs: Runs) -> dict[str, dict[str, int]]:
    """How auto's rounds spread: plain steps (no proposals made), rounds lookup proposals took from the draft, and
    drafted rounds by proposals verified."""
    def choices(category: str) -> dict[str, int]:
        count = Counter("plain" if r.drafted == 0 else "lookup" if r.looked_up else str(r.verified)
                        for r in runs.rounds(AUTO, category))
        return {k: count[k] for k in ["plain", "lookup", *map(str, range(runs.max_block))] if count[k]}

    return {c: choices(c) for c in runs.categories}


@metric
def auto_sources(runs: Runs) -> dict[str, dict[str, float]]:
    """Each source of auto's proposals (the draft, lookup; plain steps made none): its share of the rounds and tau
    (tokens a round) in them."""
    rounds = runs.rounds(AUTO)
    sources = {"draft": [r for r in rounds if r.drafted and not r.looked_up],
               "lookup": [r for r in rounds if r.drafted and r.looked_up],
               "plain": [r for r in rounds if not r.drafted]}
    return {name: {"share": len(rs) / len(rounds), "tau": sum(r.emitted for r in rs) / len(rs)}
            for name, rs in sources.items() if rs}


# What the bench stage prints, one line each: metric names, shown as name=value when the bench reports them.
HEADLINE = (("block_size", "runner", "tau", "speedup", "dflash_tokens_per_s", "ar_tokens_per_s", "lossless",
             "sampling"),
            ("draft_ms_per_round", "verify_ms_per_round", "host_ms_per_round"),
            ("speedup_by_block", "speedup_auto", "tau_auto", "mean_verify_tokens_auto"))


def shown(value) -> str:
    """A metric's value as the stage prints it, floats to two places (tools/measurements.py tabulates the same)."""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(shown, value)) + "]"
    return str(value)


def summary(metrics: dict) -> list[str]:
    """HEADLINE's lines for these metrics."""
    lines = [" ".join(f"{name}={shown(metrics[name])}" for name in names if name in metrics) for names in HEADLINE]
    return [line for line in lines if line]


# The plots dvc.yaml declares: name -> (columns, the rows from one bench's runs)
PLOTS: dict[str, tuple[tuple[str, ...], Callable[[Runs], list[dict]]]] = {}


def plot(name: str, *columns: str):
    def register(f: Callable[[Runs], list[dict]]) -> Callable[[Runs], list[dict]]:
        PLOTS[name] = columns, f
        return f
    return register


@plot("acceptance", "accepted", "rounds")
def acceptance_rows(runs: Runs) -> list[dict]:
    return [{"accepted": k, "rounds": n} for k, n in enumerate(_accepted(runs))]


@plot("speedup_by_block", "block", "speedup")
def speedup_by_block_rows(runs: Runs) -> list[dict]:
    """Every fixed block, with auto beside them."""
    return [{"block": mode, "speedup": runs.speedup(mode)} for mode in runs.modes]


@plot("cost_curve", "tokens", "target_ms_start", "draft_ms_start", "target_ms_end", "draft_ms_end")
def cost_curve_rows(runs: Runs) -> list[dict]:
    """Target and draft ms against tokens, at the start and end of the cache (auto's cost curve)."""
    curve, start, end = runs.curve, runs.curve.positions[0], runs.curve.positions[-1]
    return [{"tokens": t, "target_ms_start": curve.target(t, start),
             "draft_ms_start": curve.draft(t, start) if t > 1 else 0.0,
             "target_ms_end": curve.target(t, end), "draft_ms_end": curve.draft(t, end) if t > 1 else 0.0}
            for t in range(1, runs.max_block + 1)]


@plot("tokens_per_s", "category", "mode", "tokens_per_s")
def tokens_per_s_rows(runs: Runs) -> list[dict]:
    return [{"category": c, "mode": mode, "tokens_per_s": throughput(runs.pooled(mode, c))}
            for c in runs.categories for mode in runs.generations]


PLOT_COLUMNS = {name: columns for name, (columns, _) in PLOTS.items()}


def run_bench(programs_dir: Path, block_size: BlockSize, config: BenchConfig) -> tuple[dict, dict, CostCurve | None]:
    """Returns (metrics, plots, cost curve): the bench.json metrics, the rows of each plot, and the device's
    cost curve (auto's input; None when skipped). Everything comes from the programs directory (programs
    and tokenizer), as a user who only pulled it has. The headline tau and speedup are `block_size`'s.

    Programs this host cannot run (MLX ones anywhere but Apple silicon) give metrics that say `skipped`
    and why, and plots with no rows, so the pipeline goes on and bench runs where they can."""
    settings = config.sampling()  # first: bad settings or prompt source fail before any load
    if config.runner not in RUNNERS:
        raise ValueError(f"bench.runner must be one of {', '.join(RUNNERS)}, got {config.runner!r}")
    if any(b < 2 for b in config.block_sizes):
        raise ValueError(f"bench.block_sizes must all be at least 2 (one anchor + one proposal), got {list(config.block_sizes)}")
    rows = load_prompts(config.prompts, config.num_prompts)
    if not rows:
        raise ValueError(f"bench.prompts={config.prompts!r} has no prompts")
    skipped = missing_backend(programs_dir)
    if skipped:
        return {"block_size": block_size, "skipped": skipped}, {name: [] for name in PLOTS}, None
    with open_decoder(programs_dir, config.runner) as decoder:  # the programs, loaded once
        runs = collect(decoder, programs_dir, rows, block_size, config, settings)
    metrics = {name: value for name, f in METRICS.items() if (value := f(runs)) is not None}
    plots = {name: rows_of(runs) for name, (_, rows_of) in PLOTS.items()}
    return metrics, plots, runs.curve
