"""How much faster is DFlash than plain decoding of the same target.pte, and is it still exact?

AR and DFlash run interleaved on the same prompts in one process (so drift in machine speed
hits both alike), after a warm-up that is not counted. Throughput is decode tokens per second
(the first token comes from prefill, which both share). At temperature > 0 both sample with the
same settings (each run its own seed, the same for AR and DFlash), and tau and speedup are
measured exactly as for greedy decoding; "lossless" (token equality) is a greedy-only check.
"""

import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_et.runtime.engine import Engine
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
    repeats: int = 3
    warmup: int = 1             # prompts run (AR and DFlash) before timing starts
    latency_repeats: int = 5    # target calls timed per T for the latency curve
    temperature: float | str = 0.0  # 0: greedy; "recommended": the checkpoint's temperature, top_p and top_k
                                    # (target.pte's metadata; top_p and top_k below then do nothing)
    top_p: float = 1.0
    top_k: int | None = None
    proposals: str = "argmax"   # argmax | sample (temperature > 0)
    seed: int = 0

    def sampling(self) -> Sampling | None:
        """The explicit sampling settings (checked), or None for the programs' recommended ones."""
        if self.temperature == "recommended":
            return None
        if isinstance(self.temperature, str):
            raise ValueError(f"bench.temperature must be a number or 'recommended', got {self.temperature!r}")
        return Sampling(float(self.temperature), self.top_p, self.top_k, self.proposals, self.seed)


PLOT_COLUMNS = {"acceptance": ("accepted", "rounds"), "target_latency": ("tokens", "ms"),
                "tokens_per_s": ("category", "mode", "tokens_per_s")}  # the plots dvc.yaml declares


def target_latency_ms(engine: Engine, max_t: int, repeats: int) -> dict[int, float]:
    """Median wall time of one target.pte call at T = 1..max_t tokens, at a mid-cache position."""
    start = min(64, engine.max_seq_len - max_t)
    out = {}
    for t in range(1, max_t + 1):
        tokens, pos = torch.zeros(1, t, dtype=torch.long), torch.arange(start, start + t)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            engine.target(tokens, pos)
            times.append(time.perf_counter() - t0)
        out[t] = 1000 * statistics.median(times[1:])
    return out


def _throughput(runs: list[Generation]) -> float:
    tokens = sum(len(g.tokens) - 1 for g in runs)
    seconds = sum(g.decode_s for g in runs)
    return tokens / seconds if seconds > 0 else 0.0


def run_bench(programs_dir: Path, block_size: int, config: BenchConfig) -> tuple[dict, dict]:
    """Returns (metrics, plots): the bench.json metrics and the rows of each plot. Everything comes from
    the programs directory (programs and tokenizer), as a user who only pulled it has.

    Programs this host cannot run (MLX ones anywhere but Apple silicon) give metrics that say `skipped`
    and why, and plots with no rows, so the pipeline goes on and bench runs where they can."""
    settings = config.sampling()  # first: bad settings or prompt source fail before any load
    rows = load_prompts(config.prompts, config.num_prompts)
    if not rows:
        raise ValueError(f"bench.prompts={config.prompts!r} has no prompts")
    skipped = missing_backend(programs_dir)
    if skipped:
        return {"block_size": block_size, "skipped": skipped}, {name: [] for name in PLOT_COLUMNS}
    engine = Engine(programs_dir)
    engine.check_block_size(block_size)
    settings = settings or engine.recommended(proposals=config.proposals, seed=config.seed)

    def sampler(run: int) -> Sampler:
        return Sampler(replace(settings, seed=settings.seed + run))

    tok = tokenizer(programs_dir)
    encoded = [encode_chat(tok, r["prompt"]) for r in rows]
    for ids in encoded[:config.warmup]:
        engine.ar(ids, config.max_new_tokens, sampler=sampler(-1))
        engine.dflash(ids, config.max_new_tokens, block_size, sampler=sampler(-1))

    ar_runs, df_runs = defaultdict(list), defaultdict(list)
    lossless = True
    for repeat in tqdm(range(config.repeats), desc="bench repeats", disable=config.repeats == 1):
        for i, (row, ids) in enumerate(tqdm(list(zip(rows, encoded)), desc=f"bench (block {block_size})")):
            run = repeat * len(rows) + i
            ar = engine.ar(ids, config.max_new_tokens, sampler=sampler(run))
            df = engine.dflash(ids, config.max_new_tokens, block_size, sampler=sampler(run))
            if settings.greedy:
                lossless &= ar.tokens == df.tokens
            ar_runs[row["category"]].append(ar)
            df_runs[row["category"]].append(df)

    all_ar = [g for runs in ar_runs.values() for g in runs]
    all_df = [g for runs in df_runs.values() for g in runs]
    rounds = [r for g in all_df for r in g.rounds]
    latency = target_latency_ms(engine, block_size, config.latency_repeats)
    histogram = Counter(r.accepted for r in rounds)
    ar_tps, df_tps = _throughput(all_ar), _throughput(all_df)

    def ms(values: list[float]) -> float:
        return 1000 * sum(values) / max(len(values), 1)

    metrics = {
        "block_size": block_size,
        "sampling": settings.settings(),
        "tau": pooled_tau(all_df),
        "speedup": df_tps / ar_tps if ar_tps else 0.0,
        "ar_tokens_per_s": ar_tps,
        "dflash_tokens_per_s": df_tps,
        "draft_ms_per_round": ms([r.draft_s for r in rounds]),
        "verify_ms_per_round": ms([r.verify_s for r in rounds]),
        "host_ms_per_round": ms([r.host_s for r in rounds]),
        "ar_ms_per_token": ms([r.total_s for g in all_ar for r in g.rounds]),
        "verify_cost_ratio": latency[block_size] / latency[1],
        **({"lossless": lossless} if settings.greedy else {}),
        "prompts": len(rows), "repeats": config.repeats, "rounds": len(rounds),
        "acceptance_histogram": {str(k): histogram.get(k, 0) for k in range(block_size)},
        "tau_by_category": {c: pooled_tau(runs) for c, runs in df_runs.items()},
        "speedup_by_category": {c: _throughput(df_runs[c]) / _throughput(ar_runs[c]) for c in df_runs},
    }
    plots = {
        "acceptance": [{"accepted": k, "rounds": histogram.get(k, 0)} for k in range(block_size)],
        "target_latency": [{"tokens": t, "ms": v} for t, v in latency.items()],
        "tokens_per_s": [{"category": c, "mode": mode, "tokens_per_s": _throughput(runs[c])}
                         for c in df_runs for mode, runs in (("ar", ar_runs), ("dflash", df_runs))],
    }
    return metrics, plots
