"""The one seam between a command and the two host loops that decode: the Python engine (engine.py) and the
C++ runner (cpp_runner.py). Both implement `Decoder`; `open_decoder` picks one by name, the only place that
knows there are two. Their rules are the same (adaptive.plans: sampled auto keeps the largest block)."""

from pathlib import Path
from typing import Protocol

from dflash_et.errors import UserError
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.cpp_runner import CppEngine
from dflash_et.runtime.engine import BlockSize, Engine
from dflash_et.runtime.generate import Generation, OnTokens
from dflash_et.runtime.sampling import Sampler, Sampling

RUNNERS = ("python", "cpp")  # the host loops: dflash_et.runtime (engine.py) and dflash_runner (runner/)


class Decoder(Protocol):
    max_context_len: int
    max_block_size: int

    def check_block_size(self, block_size: BlockSize) -> BlockSize: ...
    def cost_curve(self, repeats: int = 5) -> CostCurve: ...
    def recommended(self, **overrides) -> Sampling: ...
    def ar(self, prompt: list[int], max_new_tokens: int, on_tokens: OnTokens = None,
           sampler: Sampler | None = None) -> Generation: ...
    def dflash(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation: ...
    def lookup(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Decoder": ...
    def __exit__(self, *exc) -> None: ...


def open_decoder(programs_dir: Path, runner: str = "python", cost_curve: Path | None = None) -> Decoder:
    """The programs in `programs_dir` loaded by `runner`'s host loop; `cost_curve`: auto's, as the bench wrote it
    (default: measured on first use)."""
    if runner not in RUNNERS:
        raise UserError(f"the runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    if runner == "cpp":
        return CppEngine(programs_dir, cost_curve=cost_curve)
    return Engine(programs_dir, cost_curve)
