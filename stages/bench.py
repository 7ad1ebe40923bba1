"""bench stage: `python -m stages.bench PROGRAMS REPORT PLOTS_DIR` writes bench.json (a DVC metric)
and the plot data; on a host that cannot run the programs it says so in one line, writes a `skipped`
bench.json and header-only plots (every output dvc.yaml declares exists) and succeeds."""

from pathlib import Path

from dflash_et.files import write_csv, write_json
from dflash_et.reports.bench import PLOT_COLUMNS, BenchConfig, run_bench
from stages.common import params, run


def main(argv: list[str]) -> None:
    programs, report, plots_dir = map(Path, argv)
    p = params()
    metrics, plots = run_bench(programs, int(p["block_size"]), BenchConfig(**p["bench"]))
    for name, rows in plots.items():  # a skipped bench has no rows: the columns still go out
        write_csv(plots_dir / f"{name}.csv", rows, PLOT_COLUMNS[name])
    write_json(report, metrics)
    if metrics.get("skipped"):
        print(f"[bench] skipped: {metrics['skipped']}")
        return
    exact = f"lossless={metrics['lossless']}" if "lossless" in metrics else f"sampling {metrics['sampling']}"
    print(f"[bench] block {metrics['block_size']}: tau {metrics['tau']:.2f}, speedup {metrics['speedup']:.2f}x "
          f"({metrics['dflash_tokens_per_s']:.1f} vs {metrics['ar_tokens_per_s']:.1f} tokens/s), per round: draft "
          f"{metrics['draft_ms_per_round']:.2f} ms, verify {metrics['verify_ms_per_round']:.2f} ms, host "
          f"{metrics['host_ms_per_round']:.2f} ms; {exact}")


if __name__ == "__main__":
    run(main)
