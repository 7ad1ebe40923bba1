"""bench stage: `python -m stages.bench PROGRAMS REPORT PLOTS_DIR COST_CURVE` writes bench.json (a DVC
metric), the plot data and this device's cost curve (what `dflash generate --cost-curve` reuses); on a
host that cannot run the programs it says so in one line, writes a `skipped` bench.json, header-only
plots and an empty cost curve (every output dvc.yaml declares exists) and succeeds."""

from pathlib import Path

from dflash_et.evaluate import bench
from dflash_et.files import write_csv, write_json
from dflash_et.params import params, parse
from runner.toolchain import build_runner
from stages.common import run


def main(argv: list[str]) -> None:
    programs, report, plots_dir, curve_path = map(Path, argv)
    p = params()
    config = parse(bench.BenchConfig, p.get("bench"), "bench")
    if config.runner == "cpp":  # brought up to date with runner/ (a dependency of this stage)
        build_runner()
    metrics, plots, curve = bench.run_bench(programs, p["block_size"], config)
    for name, rows in plots.items():  # a skipped bench has no rows: the columns still go out
        write_csv(plots_dir / f"{name}.csv", rows, bench.PLOTS[name][0])
    write_json(curve_path, curve.to_dict() if curve else {})
    write_json(report, metrics)
    if metrics.get("skipped"):
        print(f"[bench] skipped: {metrics['skipped']}")
        return
    for line in bench.summary(metrics):  # bench.HEADLINE's metrics, by bench.json's names
        print(f"[bench] {line}")
    if metrics.get("block_sizes_skipped"):
        print(f"[bench] not measured: blocks {metrics['block_sizes_skipped']}, larger than the programs take "
              "(the draft's trained block unless export.max_block_size says otherwise)")


if __name__ == "__main__":
    run(main)
