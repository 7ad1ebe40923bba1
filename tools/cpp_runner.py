"""The C++ runner's figures in docs/measurements.md: its attention kernel against ExecuTorch's, and its peak
resident memory with the weights in each program vs one shared.ptd loaded once.

    python -m tools.cpp_runner PROGRAMS [SHARED_PROGRAMS]

Times llama::custom_sdpa (the runner's, through libdflash_llama_ops.so, and ExecuTorch's own,
torch.ops.llama) on the shapes PROGRAMS call: the target's causal verify of 1, 12 and 16 tokens
and the draft's non-causal block of 16, at cache positions 64, 256 and near the end; then runs
dflash_runner on each programs directory (one greedy DFlash generation) and reads its peak RSS.
Build the runner first (`make runner`). ExecuTorch's op logs "No temp allocator provided" on every
call outside a program (it then allocates its own scratch); filter those lines out.
"""

import argparse
from pathlib import Path

from dflash_et.runtime.cpp_runner import CppEngine  # first: it sets OMP_NUM_THREADS before torch loads
from runner.bindings import LlamaKernels
from dflash_et.runtime.programs import load_programs
from tools.timing import median_ms

import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401,E402  (torch.ops.llama)
import torch  # noqa: E402

REPEATS = 200



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", type=Path)
    parser.add_argument("shared", type=Path, nargs="?", help="the same programs exported with export.shared_weights")
    args = parser.parse_args()
    target, draft = load_programs(args.programs)
    s_max = target.meta.max_context_len
    kernels = LlamaKernels()
    print("custom_sdpa ms (runner / ExecuTorch): q [1, T, 8, 64], caches [1, max_seq_len, 2, 64]")
    for start in (64, 256, s_max - 32):
        row = []
        for tokens, causal in ((1, True), (12, True), (16, True), (16, False)):
            q = torch.randn(1, tokens, 8, 64)
            k, v = torch.randn(2, 1, s_max, 2, 64)
            ours = median_ms(lambda: kernels.custom_sdpa(q, k, v, start, causal, 0.125), REPEATS)
            theirs = median_ms(lambda: torch.ops.llama.custom_sdpa(q, k, v, start, None, 0.0, causal, 0.125), REPEATS)
            row.append(f"T={tokens}{'' if causal else ' (draft)'}: {ours:.3f} / {theirs:.3f}")
        print(f"  position {start}: " + ", ".join(row))
    for directory in filter(None, (args.programs, args.shared)):
        with CppEngine(directory) as runner:
            runner.dflash([1, 2, 3, 4, 5] * 8, 64)
            print(f"{directory}: peak RSS {runner.peak_rss_kb / 1024:.1f} MiB after a generation "
                  f"({runner.load_rss_kb / 1024:.1f} MiB once loaded)")


if __name__ == "__main__":
    main()
