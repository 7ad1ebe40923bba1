"""`dflash serve`: serve the pipeline's programs over an OpenAI-compatible HTTP API (dflash_et/serve.py)."""

import argparse
import importlib.metadata
import re
from pathlib import Path

from dflash_et.errors import UserError

DESCRIPTION = (
    "ExecuTorch's OpenAI-compatible server (/v1/models, /v1/chat/completions, streaming, sessions) over C++ runner "
    "workers, DFlash auto by default; the chat template is the programs' own. Costs: the C++ runner (`make runner`) "
    "and the serve extra (`pip install -e '.[serve]'`); each worker holds its own copy of the programs and, without "
    "--cost-curve, measures a cost curve as it starts; a CPU is enough.")


def add(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("serve", help="serve the programs over an OpenAI-compatible HTTP API",
                       description=DESCRIPTION)
    v.set_defaults(run=serve)
    v.add_argument("--programs", type=Path, default=Path("artifacts/programs"),
                   help="directory with the programs and their tokenizer (default: %(default)s)")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    v.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    v.add_argument("--workers", type=int, default=1,
                   help="worker processes, each with its own copy of the programs and the cores shared out "
                        "(default: %(default)s)")
    v.add_argument("--queue", type=int, default=32,
                   help="requests that may wait for a worker; past them a request gets 503 (default: %(default)s)")
    v.add_argument("--block-size", default="auto", help="auto, a DFlash block, or ar: plain decoding "
                                                        "(default: %(default)s)")
    v.add_argument("--lookup", action="store_true",
                   help="lookup proposals in place of the draft's (what followed the latest earlier occurrence of the "
                        "context's last tokens; no draft call): they pay where replies repeat their input")
    v.add_argument("--cost-curve", type=Path, default=None,
                   help="auto's cost curve for these programs (reports/cost_curve.json; default: each worker "
                        "measures one as it starts)")
    v.add_argument("--threads", type=int, default=0,
                   help="threads per worker (default: the cores shared out among the workers)")
    v.add_argument("--model-id", default="dflash-et", help="the model's name on /v1/models, which requests must "
                                                          "name (default: %(default)s)")


def serve_extra() -> set[str]:
    """The packages of the `serve` extra, as the installed package declares them (pyproject.toml)."""
    requires = importlib.metadata.requires("dflash-et") or []
    return {re.split(r"[\s=<>!~;\[]", r, maxsplit=1)[0] for r in requires if re.search(r"extra\s*==\s*.serve.", r)}


def serve(args: argparse.Namespace) -> None:
    try:
        import uvicorn  # noqa: F401  (serve.serve runs it: missing, it would fail only after the workers started)

        from dflash_et import serve
    except ModuleNotFoundError as e:
        if e.name not in serve_extra():
            raise
        raise UserError(f"dflash serve needs {e.name}, which this environment lacks; install the serve extra: "
                        "pip install -e '.[serve]'") from None
    from dflash_et.runtime.cpp_runner import find_runner

    if args.lookup and args.block_size == "ar":
        raise UserError("--lookup and --block-size ar are two ways to decode; give one")
    pool = serve.make_pool(args.programs, find_runner(), args.workers, args.queue, args.block_size, args.cost_curve,
                           args.model_id, args.threads, args.lookup)
    serve.serve(pool, args.model_id, args.host, args.port)
