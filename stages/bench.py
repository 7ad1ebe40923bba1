"""bench stage: `python -m stages.bench PROGRAMS REPORT PLOTS_DIR COST_CURVE` writes bench.json (a DVC
metric), the plot data and this device's cost curve (what `dflash generate --cost-curve` reuses); on a
host that cannot run the programs it says so in one line, writes a `skipped` bench.json, header-only
plots and an empty cost curve (every output dvc.yaml declares exists) and succeeds."""

from pathlib import Path

from dflash_et.files import write_csv, write_json
from dflash_et.params import parse
from dflash_et.reports.bench import PLOT_COLUMNS, BenchConfig, run_bench
from dflash_et.runtime.cpp_runner import build_runner
from stages.common import params, run


def main(argv: list[str]) -> None:
    programs, report, plots_dir, curve_path = map(Path, argv)
    p = params()
    config = parse(BenchConfig, p.get("bench"), "bench")
    if config.runner == "cpp":  # brought up to date with runner/ (a dependency of this stage)
        build_runner()
    metrics, plots, curve = run_bench(programs, p["block_size"], config)
    for name, rows in plots.items():  # a skipped bench has no rows: the columns still go out
        write_csv(plots_dir / f"{name}.csv", rows, PLOT_COLUMNS[name])
    write_json(curve_path, curve.to_dict() if curve else {})
    write_json(report, metrics)
    if metrics.get("skipped"):
        print(f"[bench] skipped: {metrics['skipped']}")
        return
    exact = f"lossless={metrics['lossless']}" if "lossless" in metrics else f"sampling {metrics['sampling']}"
    blocks = ", ".join(f"{b}: {s:.2f}x" for b, s in metrics["speedup_by_block"].items())
    print(f"[bench] block {metrics['block_size']}: tau {metrics['tau']:.2f}, speedup {metrics['speedup']:.2f}x "
          f"({metrics['dflash_tokens_per_s']:.1f} vs {metrics['ar_tokens_per_s']:.1f} tokens/s), per round: draft "
          f"{metrics['draft_ms_per_round']:.2f} ms, verify {metrics['verify_ms_per_round']:.2f} ms, host "
          f"{metrics['host_ms_per_round']:.2f} ms; {exact}")
    auto = (f"; auto {metrics['speedup_auto']:.2f}x (tau {metrics['tau_auto']:.2f}, "
            f"{metrics['mean_verify_tokens_auto']:.1f} tokens per target call)") if "speedup_auto" in metrics else ""
    print(f"[bench] {metrics['runner']} runner, speedup by block: {blocks}{auto}")
    if metrics.get("block_sizes_skipped"):
        print(f"[bench] not measured: blocks {metrics['block_sizes_skipped']}, larger than the programs take "
              "(the draft's trained block unless export.max_block_size says otherwise)")


if __name__ == "__main__":
    run(main)
