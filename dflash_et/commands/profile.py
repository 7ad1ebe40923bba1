"""`dflash profile`: where a program call's time goes, beside this machine's roofline
(dflash_et/evaluate/profile.py)."""

import argparse
from pathlib import Path

DESCRIPTION = (
    "ExecuTorch's profiler (ETDump, read back with the devtools Inspector) on target calls of T tokens and one "
    "draft block at cache position --pos, each call's median split into columns that add up (XNNPACK's matrix "
    "products, its other operators, the delegate's overhead, attention, cache writes, other portable operators, "
    "the runtime's own time), beside the least the call could take at this machine's read bandwidth and fp32 "
    "matmul throughput (export.json's `linears`); then the most expensive operators by name. Prints a markdown "
    "table. Costs: the programs from `dvc repro` (or `dvc pull`); each program loaded once more with ETDump, each "
    "call shape run --repeats + 1 times (seconds on the built-in pair); measuring the machine first takes a few "
    "seconds and 1 GiB of memory; a CPU is enough.")


def add(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("profile", help="split each program call's time by ExecuTorch's profiler, with a roofline",
                       description=DESCRIPTION)
    f.set_defaults(run=profile)
    f.add_argument("programs", type=Path, help="a directory with target.pte and draft.pte (artifacts/programs)")
    f.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8, 16], help="target call lengths "
                                                                               "(default: %(default)s)")
    f.add_argument("--block", type=int, default=16, help="the draft's block (at most the programs' largest) "
                                                         "(default: %(default)s)")
    f.add_argument("--pos", type=int, default=64, help="cache position of every call (default: %(default)s)")
    f.add_argument("--repeats", type=int, default=5, help="timed runs of each call shape (default: %(default)s)")


def profile(args: argparse.Namespace) -> None:
    from dflash_et.evaluate.profile import report

    print(report(args.programs, args.tokens, args.block, args.pos, args.repeats))
