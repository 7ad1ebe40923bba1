"""bench stage: artifacts/reports/bench.json (DVC metric) and the plot data in artifacts/reports/plots/."""

from dflash_et.bench import BenchConfig, run_bench
from dflash_et.files import write_csv, write_json
from stages.common import PROGRAMS, REPORTS, WEIGHTS, params, run


def main() -> None:
    p = params()
    metrics, plots = run_bench(PROGRAMS, WEIGHTS / "target", int(p["block_size"]), BenchConfig(**p["bench"]))
    for name, rows in plots.items():
        write_csv(REPORTS / "plots" / f"{name}.csv", rows)
    write_json(REPORTS / "bench.json", metrics)
    print(f"[bench] block {metrics['block_size']}: tau {metrics['tau']:.2f}, speedup {metrics['speedup']:.2f}x "
          f"({metrics['dflash_tokens_per_s']:.1f} vs {metrics['ar_tokens_per_s']:.1f} tokens/s), per round: draft "
          f"{metrics['draft_ms_per_round']:.2f} ms, verify {metrics['verify_ms_per_round']:.2f} ms, host "
          f"{metrics['host_ms_per_round']:.2f} ms; lossless={metrics['lossless']}")


if __name__ == "__main__":
    run(main)
