"""How much faster is DFlash than plain decoding of the same target.pte, and is it still exact?

Plain decoding, DFlash at every fixed block in `block_sizes` and DFlash with `auto` blocks run
interleaved on the same prompts in one process (so drift in machine speed hits all alike), after
measuring this device's cost curve (which auto decides by) and a warm-up that is not counted.
Throughput is decode tokens per second (the first token comes from prefill, which all share). At temperature > 0 both sample with the
same settings (each run its own seed, the same for AR and DFlash), and tau and speedup are
measured exactly as for greedy decoding; "lossless" (token equality) is a greedy-only check.
"""

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from dflash_et.runtime.adaptive import AUTO, CostCurve
from dflash_et.runtime.decoder import RUNNERS, open_decoder
from dflash_et.runtime.engine import BlockSize
from dflash_et.runtime.generate import Generation, pooled_tau
from dflash_et.runtime.programs import missing_backend
from dflash_et.runtime.sampling import Sampler, Sampling
from dflash_et.data.prompts import encode_chat, load_prompts, tokenizer


@dataclass(frozen=True)
class BenchConfig:
    """The `bench` section of params.yaml."""

    prompts: str = "builtin"    # builtin | path to a JSONL file ({"prompt": ..., "category": ...} per line)
    num_prompts: int = 30
    max_new_tokens: int = 64
    repeats: int = 1
    warmup: int = 1             # prompts run (AR and DFlash) before timing starts
    latency_repeats: int = 10   # sweeps of decoding rounds timed for the cost curve (`adaptive._typical`)
    block_sizes: tuple[int, ...] = (2, 4, 8, 16)  # fixed blocks measured beside auto (those the programs take)
    temperature: float | str = 0.0  # 0: greedy; "recommended": the checkpoint's temperature, top_p and top_k
                                    # (target.pte's metadata; top_p and top_k below then do nothing)
    top_p: float = 1.0
    top_k: int | None = None
    proposals: str = "argmax"   # argmax | sample (temperature > 0)
    seed: int = 0
    runner: str = "python"      # python | cpp: the host loop that decodes (cpp: `make runner` builds it)

    def sampling(self) -> Sampling | None:
        """The explicit sampling settings (checked), or None for the programs' recommended ones."""
        if self.temperature == "recommended":
            return None
        if isinstance(self.temperature, str):
            raise ValueError(f"bench.temperature must be a number or 'recommended', got {self.temperature!r}")
        return Sampling(float(self.temperature), self.top_p, self.top_k, self.proposals, self.seed)


PLOT_COLUMNS = {"acceptance": ("accepted", "rounds"), "speedup_by_block": ("block", "speedup"),
                "cost_curve": ("tokens", "target_ms_start", "draft_ms_start", "target_ms_end", "draft_ms_end"),
                "tokens_per_s": ("category", "mode", "tokens_per_s")}  # the plots dvc.yaml declares


def throughput(runs: list[Generation]) -> float:
    tokens = sum(len(g.tokens) - 1 for g in runs)
    seconds = sum(g.decode_s for g in runs)
    return tokens / seconds if seconds > 0 else 0.0


def _ms(values: list[float]) -> float:
    return 1000 * sum(values) / max(len(values), 1)


def _blocks(config: BenchConfig, block_size: BlockSize, max_block: int) -> tuple[list[int], list[int]]:
    """(fixed blocks to run, blocks of `block_sizes` the programs do not take)."""
    wanted = set(config.block_sizes) | ({int(block_size)} if block_size != AUTO else set())
    return sorted(b for b in wanted if b <= max_block), sorted(b for b in wanted if b > max_block)


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
        return {"block_size": block_size, "skipped": skipped}, {name: [] for name in PLOT_COLUMNS}, None
    decoder = open_decoder(programs_dir, config.runner)  # the programs, loaded once
    headline = str(decoder.check_block_size(block_size))
    settings = settings or decoder.recommended(proposals=config.proposals, seed=config.seed)
    fixed, too_large = _blocks(config, block_size, decoder.max_block_size)
    modes = {str(b): b for b in fixed} | {AUTO: AUTO}
    curve = decoder.cost_curve(config.latency_repeats)  # auto's input, timed by the runner that decodes

    def sampler(run: int) -> Sampler:
        return Sampler(replace(settings, seed=settings.seed + run))

    tok = tokenizer(programs_dir)
    encoded = [encode_chat(tok, r["prompt"]) for r in rows]
    for ids in encoded[:config.warmup]:
        decoder.ar(ids, config.max_new_tokens, sampler=sampler(-1))
        for block in modes.values():
            decoder.dflash(ids, config.max_new_tokens, block, sampler=sampler(-1))

    # runs[mode][repeat][category]: the generations of each mode, "ar" being plain decoding
    runs = {mode: [defaultdict(list) for _ in range(config.repeats)] for mode in ["ar", *modes]}
    lossless = True
    for repeat in tqdm(range(config.repeats), desc="bench repeats", disable=config.repeats == 1):
        for i, (row, ids) in enumerate(tqdm(list(zip(rows, encoded)), desc=f"bench ({len(runs)} modes)")):
            run = repeat * len(rows) + i
            ar = decoder.ar(ids, config.max_new_tokens, sampler=sampler(run))
            runs["ar"][repeat][row["category"]].append(ar)
            for mode, block in modes.items():
                out = decoder.dflash(ids, config.max_new_tokens, block, sampler=sampler(run))
                lossless &= out.tokens == ar.tokens or not settings.greedy
                runs[mode][repeat][row["category"]].append(out)

    categories = list(runs["ar"][0])

    def pooled(mode: str, category: str | None = None) -> list[Generation]:
        return [g for per_repeat in runs[mode] for c, gs in per_repeat.items() if category in (None, c) for g in gs]

    def speedup(mode: str, category: str | None = None) -> float:
        ar = throughput(pooled("ar", category))
        return throughput(pooled(mode, category)) / ar if ar else 0.0

    def mean_verify_tokens(category: str | None = None) -> float:
        return statistics.fmean(r.proposed + 1 for g in pooled(AUTO, category) for r in g.rounds)

    def choices(category: str) -> dict[str, int]:
        """How auto's rounds spread: plain steps (no draft call), and drafted rounds by proposals verified."""
        count = Counter("plain" if r.drafted == 0 else str(r.proposed) for g in pooled(AUTO, category) for r in g.rounds)
        return {k: count[k] for k in ["plain", *map(str, range(decoder.max_block_size))] if count[k]}

    def spread(mode: str, category: str | None = None) -> list[float]:
        """The lowest and highest speedup of one repeat: the run's own noise, to judge differences by."""
        per_repeat = []
        for repeat in range(config.repeats):
            def of(m: str) -> list[Generation]:
                return [g for c, gs in runs[m][repeat].items() if category in (None, c) for g in gs]
            ar = throughput(of("ar"))
            per_repeat.append(throughput(of(mode)) / ar if ar else 0.0)
        return [min(per_repeat), max(per_repeat)]

    main_runs = pooled(headline)
    rounds = [r for g in main_runs for r in g.rounds]
    drafted = [r for r in rounds if r.drafted]
    histogram = Counter(r.accepted for r in drafted)
    ar_tps, df_tps = throughput(pooled("ar")), throughput(main_runs)
    ar_rounds = [r for g in pooled("ar") for r in g.rounds]
    metrics = {
        "block_size": block_size,
        "runner": config.runner,
        "sampling": settings.settings(),
        "tau": pooled_tau(main_runs),
        "speedup": df_tps / ar_tps if ar_tps else 0.0,
        "ar_tokens_per_s": ar_tps,
        "dflash_tokens_per_s": df_tps,
        "draft_ms_per_round": _ms([r.draft_s for r in rounds]),
        "verify_ms_per_round": _ms([r.verify_s for r in rounds]),
        "host_ms_per_round": _ms([r.host_s for r in rounds]),
        "ar_ms_per_token": _ms([r.total_s for r in ar_rounds]),
        **({"lossless": lossless} if settings.greedy else {}),
        "prompts": len(rows), "repeats": config.repeats, "rounds": len(rounds),
        "acceptance_histogram": {str(k): histogram.get(k, 0) for k in range(decoder.max_block_size)},
        "tau_by_category": {c: pooled_tau(pooled(headline, c)) for c in categories},
        "speedup_by_category": {c: speedup(headline, c) for c in categories},
        "speedup_by_block": {str(b): speedup(str(b)) for b in fixed},
        "tau_by_block": {str(b): pooled_tau(pooled(str(b))) for b in fixed},
        "speedup_by_block_by_category": {c: {str(b): speedup(str(b), c) for b in fixed} for c in categories},
        "speedup_range_over_repeats": {mode: spread(mode) for mode in modes},
        "speedup_range_over_repeats_by_category": {c: {mode: spread(mode, c) for mode in modes} for c in categories},
        **({"block_sizes_skipped": too_large} if too_large else {}),
    }
    start, end = curve.positions[0], curve.positions[-1]  # auto's cost curve
    metrics |= {
        "verify_cost_ratio": curve.target(decoder.max_block_size, start) / curve.target(1, start),
        "speedup_auto": speedup(AUTO),
        "tau_auto": pooled_tau(pooled(AUTO)),
        "mean_verify_tokens_auto": mean_verify_tokens(),
        "speedup_auto_by_category": {c: speedup(AUTO, c) for c in categories},
        "tau_auto_by_category": {c: pooled_tau(pooled(AUTO, c)) for c in categories},
        "mean_verify_tokens_auto_by_category": {c: mean_verify_tokens(c) for c in categories},
        "auto_rounds_by_category": {c: choices(c) for c in categories},
    }
    plots = {
        "acceptance": [{"accepted": k, "rounds": histogram.get(k, 0)} for k in range(decoder.max_block_size)],
        "speedup_by_block": [{"block": mode, "speedup": speedup(mode)} for mode in modes],
        "cost_curve": [{"tokens": t, "target_ms_start": curve.target(t, start),
                        "draft_ms_start": curve.draft(t, start) if t > 1 else 0.0,
                        "target_ms_end": curve.target(t, end), "draft_ms_end": curve.draft(t, end) if t > 1 else 0.0}
                       for t in range(1, decoder.max_block_size + 1)],
        "tokens_per_s": [{"category": c, "mode": mode, "tokens_per_s": throughput(pooled(mode, c))}
                         for c in categories for mode in runs],
    }
    decoder.close()
    return metrics, plots, curve
