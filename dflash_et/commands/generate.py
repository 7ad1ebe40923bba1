"""`dflash generate`: run the pipeline's programs on a prompt, streaming the text as it is accepted."""

import argparse
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from dflash_et.data.chat import TextStream, encode_chat, tokenizer
from dflash_et.errors import UserError
from dflash_et.runtime.adaptive import AUTO, plans
from dflash_et.runtime.decoder import RUNNERS, Decoder, open_decoder
from dflash_et.runtime.engine import BlockSize
from dflash_et.runtime.sampling import PROPOSALS, Sampler, Sampling

DESCRIPTION = (
    "Generate a reply to one user prompt (chat template applied, Qwen3 thinking off) with target.pte + draft.pte "
    "(programs exported with model.draft: none: target.pte and lookup proposals), and print tau and tokens/s. "
    "Greedy unless --temperature or --sample; sampled DFlash has exactly the target's "
    "distribution. Costs: the programs from `dvc repro` (or `dvc pull`), memory-mapped; with --block-size auto and "
    "no --cost-curve, one sweep at load (seconds on the built-in pair, about 300 calls of each program in general); "
    "a CPU is enough; --runner cpp needs the C++ runner (`make runner`).")


def add(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate a reply to one prompt", description=DESCRIPTION)
    g.set_defaults(run=generate)
    g.add_argument("--prompt", required=True, help="the user message")
    g.add_argument("--programs", type=Path, default=Path("artifacts/programs"),
                   help="directory with target.pte, draft.pte (and shared.ptd) (default: %(default)s)")
    g.add_argument("--tokenizer", type=Path, default=None,
                   help="directory with the target's tokenizer files (default: the programs directory)")
    g.add_argument("--ar", action="store_true", help="plain autoregressive decoding with target.pte (the baseline)")
    g.add_argument("--lookup", action="store_true",
                   help="lookup proposals in place of the draft's: what followed the latest earlier occurrence of the "
                        "context's last tokens, verified by target.pte (no draft call; pays where the reply repeats "
                        "its prompt); at auto, as many of each round's as pay on this device, none where they do not")
    g.add_argument("--block-size", type=block_size, default=None,
                   help="DFlash block: last token + proposals, or auto: chosen each round from this device's "
                        "cost curve and the draft's confidence (default: auto)")
    g.add_argument("--runner", choices=RUNNERS, default="python",
                   help="python: the engine over executorch.runtime; cpp: the C++ runner (`make runner`), "
                        "text printed when the reply is done; its seeds give other tokens than the Python "
                        "engine's (default: %(default)s)")
    g.add_argument("--cost-curve", type=Path, default=None,
                   help="with --block-size auto: this device's cost curve for these programs, as the bench "
                        "stage writes it (reports/cost_curve.json) (default: measured at load, one sweep: seconds "
                        "on the built-in pair, about 300 calls of each program in general)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default: %(default)s)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object per completion {tokens, text, tau, tokens_per_s, and seed when "
                        "sampling} instead of streaming text")
    s = g.add_argument_group("sampling (default: greedy)")
    s.add_argument("--sample", action="store_true",
                   help="sample with the checkpoint's recommended settings (carried by target.pte); the options "
                        "below override them")
    s.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    s.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep the most likely tokens "
                                                              "covering this probability, in (0, 1]")
    s.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (k >= 1)")
    s.add_argument("--proposals", choices=PROPOSALS, default=None,
                   help="the draft's proposals when sampling: its argmax (default) or samples from it; both exact")
    s.add_argument("--seed", type=int, default=None,
                   help="seed of the first completion's draws (default: a fresh one, printed); completion i uses "
                        "seed + i, so the same seed gives the same tokens")
    s.add_argument("--num-samples", type=int, default=1, help="independent completions to generate (default: 1)")


def block_size(value: str) -> BlockSize:
    """--block-size: a number of tokens or auto."""
    if value == AUTO:
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"must be a number of tokens or {AUTO}, got {value!r}")
    return int(value)


def sampling_flags(args: argparse.Namespace) -> dict:
    """The sampling flags given (checked before any program is loaded), with a fresh seed unless --seed."""
    if args.num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {args.num_samples}")
    if not args.sample and args.temperature is None and (args.top_p is not None or args.top_k is not None):
        raise UserError("--top-p and --top-k shape sampling: give --temperature too, or --sample for the "
                        "checkpoint's recommended settings")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    flags = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
             "proposals": args.proposals, "seed": seed}
    flags = {k: v for k, v in flags.items() if v is not None}
    Sampling(**{"temperature": 1.0, **flags})  # bad values fail here, in one line
    return flags


def generate(args: argparse.Namespace) -> None:
    flags = sampling_flags(args)
    if args.ar and args.lookup:
        raise UserError("--ar and --lookup are two ways to decode; give one")
    args.block_size = args.block_size or AUTO
    engine = open_decoder(args.programs, args.runner, args.cost_curve)
    settings = engine.recommended(**flags) if args.sample else Sampling(**flags)
    if not args.ar and plans(args.block_size, settings.greedy):
        engine.cost_curve(repeats=1)  # one sweep at load (the bench's file, from several, is steadier)
    if args.sample and settings.greedy:
        print(f"note: {args.programs / 'target.pte'} recommends greedy decoding (its checkpoint's do_sample is "
              "false); give --temperature to sample", file=sys.stderr)
    tok = tokenizer(args.tokenizer or args.programs)
    prompt = encode_chat(tok, args.prompt)
    for i in range(args.num_samples):
        if args.num_samples > 1 and not args.json:
            print(f"--- sample {i + 1} of {args.num_samples} ---")
        complete(args, engine, Sampler(replace(settings, seed=settings.seed + i)), tok, prompt)


def complete(args: argparse.Namespace, engine: Decoder, sampler: Sampler, tok: PreTrainedTokenizerBase,
             prompt: list[int]) -> None:
    """One completion, streamed as text (or printed as one JSON line)."""
    shown = TextStream(tok)

    def stream(new: list[int]) -> None:
        sys.stdout.write(shown.push(new))
        sys.stdout.flush()

    on_tokens = None if args.json else stream
    if args.ar:
        out = engine.ar(prompt, args.max_new_tokens, on_tokens, sampler)
    elif args.lookup:
        out = engine.lookup(prompt, args.max_new_tokens, args.block_size, on_tokens, sampler)
    else:
        out = engine.dflash(prompt, args.max_new_tokens, args.block_size, on_tokens, sampler)
    settings = sampler.sampling
    if args.json:
        text = tok.decode(out.tokens, skip_special_tokens=True)
        print(json.dumps({"tokens": out.tokens, "text": text, "tau": out.tau, "tokens_per_s": out.tokens_per_s,
                          **({} if settings.greedy else {"seed": settings.seed})}), flush=True)
    else:
        sys.stdout.write(shown.end() + "\n")
        how = "greedy" if settings.greedy else (f"temperature {settings.temperature:g}, top-p {settings.top_p:g}, "
                                                f"top-k {settings.top_k or 'off'}, seed {settings.seed}")
        mode = "ar" if args.ar else "lookup" if args.lookup else "dflash"
        print(f"[{mode}] {len(out.tokens)} tokens, tau {out.tau:.2f}, "
              f"{out.tokens_per_s:.1f} tokens/s ({how})", file=sys.stderr)
