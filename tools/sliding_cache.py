"""Target call latency with full-length vs ring-buffer caches for sliding-window layers, at a short
and a long position: the measurement behind `export.sliding_cache`.

    python -m tools.sliding_cache OUT_DIR [--max-seq-len 4096] [--window 256]

Exports a random Gemma-4-architecture target (five sliding layers and one full layer, the 31B's
pattern) twice with XNNPACK, once per `export.sliding_cache`, then times single calls of T=1 and
T=16 tokens at each position, interleaving the two programs. A full-length cache under a window
mask costs every call a pass over all max_seq_len rows (the masked kernel attends over the whole
cache); a ring costs window + longest call - 1 rows.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from dflash_et.checkpoints import builtin
from dflash_et.export.lower import ExportConfig, export_program
from dflash_et.runtime.programs import TargetProgram

REPEATS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--window", type=int, default=256)
    args = parser.parse_args()
    target, draft = args.out / "target", args.out / "draft"
    if not target.exists():
        builtin.write_target(target, trained=False, family="gemma4",
                             shape={"sliding_window": args.window, "max_position_embeddings": args.max_seq_len})
        builtin.write_draft(draft, target)
    programs = {}
    for cache in ("full", "ring"):
        build = args.out / cache
        if not (build / "target.pte").exists():
            export_program("target", target, draft, ExportConfig(max_seq_len=args.max_seq_len, prefill_chunk=64,
                                                                 max_block_size=16, sliding_cache=cache), build)
        programs[cache] = TargetProgram(build / "target.pte")
    print(f"window {args.window}, max_seq_len {args.max_seq_len}: median ms per target call over {REPEATS}")
    for pos in (128, args.max_seq_len - 64):
        for t in (1, 16):
            times = {cache: [] for cache in programs}
            tokens, input_pos = torch.zeros(1, t, dtype=torch.long), torch.arange(pos, pos + t)
            for _ in range(REPEATS):
                for cache, program in programs.items():  # interleaved: drift on a shared host hits both alike
                    start = time.perf_counter()
                    program(tokens, input_pos)
                    times[cache].append((time.perf_counter() - start) * 1e3)
            row = ", ".join(f"{cache} {statistics.median(v):.2f}" for cache, v in times.items())
            print(f"position {pos}, T={t}: {row}", flush=True)


if __name__ == "__main__":
    main()
