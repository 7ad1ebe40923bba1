"""`dflash compare`: DFlash against DFlash2 drafts for one target, trained with the same budget and benched in one
run (dflash_et/evaluate/variants.py)."""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

DESCRIPTION = (
    "Fetch a target (--target, default params.yaml's model.target; prompt sets left at auto follow it), train one "
    "draft per variant with params.yaml's train_draft section otherwise unchanged (same replies, seed and compute "
    "budget), export the target once and each draft with the export section, bench each pair with the bench "
    "section, and write OUT_DIR/compare.json (per variant: held-out tau and steps from training; the bench's tau "
    "and speedup overall, per category and per fixed block, auto's, the draft's and verify's ms per round, "
    "lossless) and print it as a table. Run it from the project's root. A rerun with the same settings reuses "
    "each step's output in OUT_DIR (a run that failed late resumes); other settings are refused. Costs: two "
    "trainings, exports and benches, on the CPU: about half an hour and 2 GB for the built-in target on 2 cores, "
    "an hour and a half and 4.6 GiB for SmolLM2 (docs/measurements.md#dflash2-against-dflash); the disk: a target "
    "and both drafts, their builds and programs.")


def add(sub: argparse._SubParsersAction) -> None:
    from dflash_et.checkpoints.zlab import ARCHITECTURES

    c = sub.add_parser("compare", help="train DFlash and DFlash2 drafts for one target and bench both (long)",
                       description=DESCRIPTION)
    c.set_defaults(run=compare)
    c.add_argument("out", type=Path, metavar="OUT_DIR", help="where every step's output and compare.json go")
    c.add_argument("--target", help="a model.target spec (default: params.yaml's)")
    c.add_argument("--variants", nargs="+", default=list(ARCHITECTURES), choices=list(ARCHITECTURES),
                   help="the drafts to train (default: %(default)s)")


def compare(args: argparse.Namespace) -> None:
    from dflash_et import show_progress
    from dflash_et.evaluate import bench, variants
    from dflash_et.params import parse, params

    show_progress()
    p = params(args.target)  # prompt sets left at auto follow the target
    results = variants.compare(args.out, str(p["model"].target), args.variants, p)
    print("\n".join(variants.table(results)))
    print(f"settings: {json.dumps(asdict(parse(bench.BenchConfig, p.get('bench'), 'bench')))}")
