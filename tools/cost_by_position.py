"""What a decoding round costs deep into the cache: the cost curve (the one auto plans by) at chosen positions.

    python -m tools.cost_by_position PROGRAMS_DIR [PROGRAMS_DIR ...] [--positions 256 1024 2048 4000] [--repeats 5]

For each programs directory, in turn, decoding rounds of every block are timed as the engine's own cost curve
times them (runtime.cost_curve.measure_cost_curve: rounds run by generate_dflash, the same shapes back to back),
with sweeps starting at each position. It prints, per position (the sweep's mean), a plain step (the target on
one token), the target on the largest block and the draft on it, in ms. Two programs directories that differ in
one setting (a draft with and without a context window) show what that setting does to a round's cost.
"""

import argparse
from pathlib import Path

import dflash_et  # noqa: F401  (one OpenMP thread before torch loads: see dflash_et.threads)
from dflash_et.runtime.cost_curve import measure_cost_curve
from dflash_et.runtime.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", type=Path, nargs="+")
    parser.add_argument("--positions", type=int, nargs="+", default=[256, 1024, 2048, 4000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for programs in args.programs:
        engine = Engine(programs)
        b = engine.max_block_size
        curve = measure_cost_curve(engine.target, engine.draft, b, engine.max_context_len, engine.mask_token_id,
                                   engine.chunk, args.repeats, starts=args.positions)
        print(f"{programs} (context window {engine.draft.context_window}): ms per call")
        print(f"| position | target T=1 | target T={b} | draft B={b} |")
        print("|---|---|---|---|")
        for pos, target, draft in zip(curve.positions, curve.target_ms, curve.draft_ms):
            print(f"| {pos} | {target[0]:.2f} | {target[-1]:.2f} | {draft[-1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
