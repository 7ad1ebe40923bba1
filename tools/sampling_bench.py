"""DFlash at temperature: tau and speedup over plain sampling, for both proposal modes, beside greedy.
The measurement behind `bench.proposals`' default and the sampling figures in docs/measurements.md.

    python -m tools.sampling_bench PROGRAMS_DIR [--num-prompts 30] [--repeats 2] [--block-size 16]

Runs the bench library (`run_bench`, the bench stage's own code) on the programs once per setting:
greedy, temperature 0.7 (top-p and top-k off) and the checkpoint's recommended settings (target.pte's
metadata), each with argmax and with sampled proposals, and prints one row per setting.
"""

import argparse
from pathlib import Path

from dflash_et.evaluate.bench import BenchConfig, run_bench

SETTINGS = [(0.0, "argmax"), (0.7, "argmax"), (0.7, "sample"), ("recommended", "argmax"), ("recommended", "sample")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", type=Path)
    parser.add_argument("--num-prompts", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    print("| temperature | proposals | tau | speedup | math | code | chat | host ms/round |")
    print("|---|---|---|---|---|---|---|---|")
    for temperature, proposals in SETTINGS:
        config = BenchConfig(num_prompts=args.num_prompts, repeats=args.repeats, latency_repeats=2,
                             temperature=temperature, proposals=proposals)
        m, _, _ = run_bench(args.programs, args.block_size, config)
        by_category = " | ".join(f"{m['tau_by_category'][c]:.2f} / {m['speedup_by_category'][c]:.2f}x"
                                 for c in ("math", "code", "chat"))
        s = m["sampling"]
        label = temperature if temperature != "recommended" else \
            f"recommended ({s['temperature']:g} / {s['top_p']:g} / {s['top_k']})"
        print(f"| {label} | {proposals if temperature else '-'} | {m['tau']:.2f} | {m['speedup']:.2f}x | {by_category} "
              f"| {m['host_ms_per_round']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
