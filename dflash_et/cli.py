"""`dflash generate`: run the pipeline's programs on a prompt, streaming the text as it is accepted."""

import argparse
import json
import sys
from pathlib import Path

from dflash_et.runtime.engine import Engine
from dflash_et.errors import UserError
from dflash_et.data.prompts import encode_chat, tokenizer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash", description="Run DFlash speculative decoding on ExecuTorch programs.")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate a reply to one prompt",
                       description="Generate a reply to one user prompt (chat template applied, Qwen3 thinking off) "
                                   "with target.pte + draft.pte, greedily, and print tau and tokens/s.")
    g.add_argument("--prompt", required=True, help="the user message")
    g.add_argument("--programs", type=Path, default=Path("artifacts/programs"),
                   help="directory with target.pte, draft.pte (and shared.ptd) (default: %(default)s)")
    g.add_argument("--tokenizer", type=Path, default=None,
                   help="directory with the target's tokenizer files (default: the programs directory)")
    g.add_argument("--ar", action="store_true", help="plain autoregressive decoding with target.pte (the baseline)")
    g.add_argument("--block-size", type=int, default=None,
                   help="DFlash block: last token + proposals (default: the largest draft.pte supports)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default: %(default)s)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object {tokens, text, tau, tokens_per_s} instead of streaming text")
    return p


def generate(args: argparse.Namespace) -> None:
    engine = Engine(args.programs)
    tok = tokenizer(args.tokenizer or args.programs)
    prompt = encode_chat(tok, args.prompt)
    emitted: list[int] = []
    shown = ""

    def stream(new: list[int]) -> None:
        nonlocal shown
        emitted.extend(new)
        text = tok.decode(emitted, skip_special_tokens=True)
        if text.startswith(shown):  # a partial UTF-8 character can decode differently until complete
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    on_tokens = None if args.json else stream
    if args.ar:
        out = engine.ar(prompt, args.max_new_tokens, on_tokens)
    else:
        out = engine.dflash(prompt, args.max_new_tokens, args.block_size, on_tokens)
    text = tok.decode(out.tokens, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"tokens": out.tokens, "text": text, "tau": out.tau, "tokens_per_s": out.tokens_per_s}))
    else:
        sys.stdout.write(text[len(shown):] + "\n")
        print(f"[{'ar' if args.ar else 'dflash'}] {len(out.tokens)} tokens, tau {out.tau:.2f}, "
              f"{out.tokens_per_s:.1f} tokens/s", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        generate(args)
    except (UserError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
