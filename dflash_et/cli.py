"""`dflash`: the project's user commands, one module each in dflash_et/commands/ (its parser and a thin run over
the library). Each command imports its library when it runs, so `dflash --help` is quick and `dflash train-draft`
runs on a machine without ExecuTorch (as `python -m dflash_et.cli train-draft ...` where nothing is installed)."""

import argparse
import sys

from dflash_et.commands import compare, generate, profile, serve, train_draft
from dflash_et.errors import UserError

COMMANDS = (generate, serve, train_draft, compare, profile)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash", description="Run, serve, train and measure DFlash speculative decoding on ExecuTorch "
                                   "programs. `dflash COMMAND --help` says what a command does and what it costs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.argv = argv
    try:
        args.run(args)
    except (UserError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
