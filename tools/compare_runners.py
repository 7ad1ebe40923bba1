"""The Python and C++ runners' `auto` in one run, each against its own plain decoding (docs/measurements.md).

    python -m tools.compare_runners PROGRAMS [--turns 3] [--max-new-tokens 64] [--prompts builtin]

Both engines load the same programs and each measures its own cost curve; then every prompt of the bench's
set is decoded by both, plainly and with auto, greedy, the order of the two alternating prompt by prompt, so
that the machine's drift falls on both alike (two bench runs one after the other differ by more than the
runners do). Each turn prints both speedups, their auto's tau and the ratio. Build the runner first (`make runner`).
"""

import argparse
from pathlib import Path

from dflash_et.runtime.decoder import open_decoder  # first: it sets OMP_NUM_THREADS before torch loads
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import load_prompts
from dflash_et.evaluate.bench import throughput
from dflash_et.runtime.adaptive import AUTO
from dflash_et.runtime.generate import pooled_tau
from dflash_et.runtime.sampling import Sampler, Sampling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", type=Path)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="builtin", help="a bench.prompts source")
    parser.add_argument("--num-prompts", type=int, default=30)
    parser.add_argument("--latency-repeats", type=int, default=10, help="sweeps timed for each cost curve")
    args = parser.parse_args()
    tok = tokenizer(args.programs)
    prompts = [encode_chat(tok, row["prompt"]) for row in load_prompts(args.prompts, args.num_prompts)]
    greedy = Sampler(Sampling())
    with open_decoder(args.programs, "python") as python, open_decoder(args.programs, "cpp") as cpp:
        engines = {"python": python, "cpp": cpp}
        for engine in engines.values():
            engine.cost_curve(args.latency_repeats)
            engine.ar(prompts[0], args.max_new_tokens, sampler=greedy)  # warm-up
            engine.dflash(prompts[0], args.max_new_tokens, AUTO, sampler=greedy)
        for turn in range(args.turns):
            runs = {(name, mode): [] for name in engines for mode in ("ar", AUTO)}
            for i, ids in enumerate(prompts):
                for name in (list(engines) if (i + turn) % 2 == 0 else list(engines)[::-1]):
                    ar = engines[name].ar(ids, args.max_new_tokens, sampler=greedy)
                    out = engines[name].dflash(ids, args.max_new_tokens, AUTO, sampler=greedy)
                    if out.tokens != ar.tokens:
                        raise SystemExit(f"error: {name}'s auto is not lossless on prompt {i}")
                    runs[name, "ar"].append(ar)
                    runs[name, AUTO].append(out)
            speedup = {name: throughput(runs[name, AUTO]) / throughput(runs[name, "ar"]) for name in engines}
            print(f"turn {turn}: " + ", ".join(
                f"{name} auto {speedup[name]:.3f}x (plain {throughput(runs[name, 'ar']):.0f} tok/s, "
                f"auto {throughput(runs[name, AUTO]):.0f} tok/s, tau {pooled_tau(runs[name, AUTO]):.2f})"
                for name in engines)
                  + f"; cpp / python {speedup['cpp'] / speedup['python']:.3f}", flush=True)


if __name__ == "__main__":
    main()
