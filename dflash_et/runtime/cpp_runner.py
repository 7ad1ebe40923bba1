"""The C++ runner (`runner/`, `dflash_runner`) behind the engine's interface: the same decoding loop,
with no Python between the program calls.

`CppEngine` keeps one `dflash_runner --worker --ids` process per programs directory (the worker protocol `dflash
serve` speaks, with ids in and out: runner/worker/worker.h), so that the programs load once, as in the Python engine,
and each round's tokens stream back as the runner accepts them. The runner decodes at fixed blocks or
`auto` (runner/host/planner.cpp, the one planner both runners call, with its cost curve from the bench's file or
measured by the runner), greedy or sampled by the same algorithm, with a DFlash draft or a DFlash2 one; its seeded
generator is its own, so a seed gives other tokens than in the Python engine. `make runner` builds it (runner/toolchain.py).
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from dflash_et.errors import ProgramError, UserError
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.generate import Generation, OnTokens, Round
from dflash_et.runtime.engine import BlockSize, check_block_size, recommended
from dflash_et.runtime.native import BUILD, PACKAGE_CLONE
from dflash_et.runtime.sampling import Sampler, Sampling

BINARY = BUILD / "dflash_runner"  # where `make runner` leaves it, in the clone it runs in


def find_runner() -> Path:
    """dflash_runner: $DFLASH_RUNNER, else the build in the clone the command runs in, else in the clone this
    package was installed from, else one on PATH (an installed runner)."""
    if os.environ.get("DFLASH_RUNNER"):
        return Path(os.environ["DFLASH_RUNNER"])
    for candidate in (Path.cwd() / BINARY, PACKAGE_CLONE / BINARY):
        if candidate.is_file():
            return candidate
    on_path = shutil.which("dflash_runner")
    if on_path is None:
        raise UserError(f"the C++ runner is not built (no {BINARY} here or in {PACKAGE_CLONE}, none on PATH, "
                        "DFLASH_RUNNER unset); run `make runner`")
    return Path(on_path)


class CppEngine:
    """`ar` and `dflash` of `Engine`, run by dflash_runner over the programs in `programs_dir`."""

    def __init__(self, programs_dir: Path, binary: Path | None = None, threads: int = 0,
                 cost_curve: Path | None = None):
        """`binary`: default `find_runner()`'s; `threads`: the runtime's thread pool size (0: one per core; fewer
        leave cores to other processes); `cost_curve`: auto's, as the bench wrote it for these programs (default:
        the runner measures one)."""
        binary = binary or find_runner()
        if not binary.is_file():
            raise UserError(f"the C++ runner is not built ({binary} is missing); run `make runner`")
        self._log = tempfile.TemporaryFile("w+")  # the runtime's log lines; read when something fails
        curve = ["--cost-curve", str(cost_curve)] if cost_curve else []
        self._process = subprocess.Popen([str(binary), "--programs", str(programs_dir), "--worker", "--ids",
                                          "--threads", str(threads), *curve], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self.meta = self._next()  # limits, and the recommended sampling when target.pte carries it
        self.max_context_len, self.max_block_size = self.meta["max_context_len"], self.meta["max_block"]
        self.load_rss_kb = self.meta["peak_rss_kb"]  # peak resident memory once both programs are loaded
        self.programs_dir = programs_dir

    def _failure(self) -> str:
        """The runner's own one-line error, from its stderr."""
        self._process.wait()
        self._log.seek(0)
        errors = [line for line in self._log.read().splitlines() if line.startswith("error: ")]
        return errors[-1].removeprefix("error: ") if errors else f"dflash_runner exited with status {self._process.returncode}"

    def _next(self) -> dict:
        """The worker's next line; its error as ProgramError (a program call failed) or UserError (the request)."""
        line = self._process.stdout.readline()
        if not line:
            raise ProgramError(self._failure())
        out = json.loads(line)
        if "error" in out:
            raise (ProgramError if out.get("code") == "generation_failed" else UserError)(out["error"])
        return out

    def _send(self, request: dict) -> None:
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()

    def _request(self, request: dict, on_tokens: OnTokens) -> Generation:
        """One generation: each round's tokens to `on_tokens` as they come, then its record."""
        self._send(request)
        while "done" not in (out := self._next()):
            on_tokens and on_tokens(out["ids"])
        self.peak_rss_kb = out["peak_rss_kb"]
        return Generation(out["tokens"], out["prefill_s"], [Round(**r) for r in out["rounds"]])

    def check_block_size(self, block_size: BlockSize) -> BlockSize:
        """Checked before any decoding (the bench's blocks); `dflash` leaves the range to the runner."""
        return check_block_size(block_size, self.max_block_size, "draft.pte")

    def cost_curve(self, repeats: int = 5) -> CostCurve:
        """auto's cost curve in the runner: the one it was given, or measured there now (once)."""
        self._send({"op": "cost_curve", "repeats": repeats})
        return CostCurve(**self._next()["cost_curve"])

    def recommended(self, **overrides) -> Sampling:
        """The checkpoint's recommended sampling settings (target.pte's metadata), `overrides` on top."""
        return recommended(self.meta, self.programs_dir / "target.pte", **overrides)

    @staticmethod
    def _generate(mode: str, prompt: list[int], max_new_tokens: int, sampler: Sampler | None, **more) -> dict:
        """A worker request (greedy without a sampler; the seed taken as given: --ids)."""
        s = sampler.sampling if sampler else Sampling()
        sampling = {} if s.greedy else {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or 0,
                                        "proposals": s.proposals, "seed": s.seed}
        return {"prompt_segments": [{"ids": prompt}], "max_new_tokens": max_new_tokens, "mode": mode} | sampling | more

    def ar(self, prompt: list[int], max_new_tokens: int, on_tokens: OnTokens = None,
           sampler: Sampler | None = None) -> Generation:
        """Plain decoding with target.pte alone (greedy unless a sampler says otherwise)."""
        return self._request(self._generate("ar", prompt, max_new_tokens, sampler), on_tokens)

    def dflash(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation:
        """DFlash at a fixed block (default: the largest draft.pte takes) or `auto` (sampled: the largest block,
        as `Engine.dflash`), greedy unless a sampler says otherwise."""
        return self._decode("dflash", prompt, max_new_tokens, block_size, on_tokens, sampler)

    def lookup(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation:
        """Lookup proposals verified by target.pte, at a fixed block (default: the largest the programs take) or `auto`
        (as `Engine.lookup`)."""
        return self._decode("lookup", prompt, max_new_tokens, block_size, on_tokens, sampler)

    def _decode(self, mode: str, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None,
                on_tokens: OnTokens, sampler: Sampler | None) -> Generation:
        block = block_size or self.max_block_size
        return self._request(self._generate(mode, prompt, max_new_tokens, sampler, block_size=block), on_tokens)

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait()
        self._log.close()

    def __enter__(self) -> "CppEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
