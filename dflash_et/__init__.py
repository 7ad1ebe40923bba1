"""dflash-et: build, validate and benchmark DFlash speculative decoding as ExecuTorch programs."""

import logging
import sys
import warnings

from dflash_et.threads import single_threaded_openmp

single_threaded_openmp()


def _has_cuda() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available()


# deprecations inside ExecuTorch's custom ops and torch's pytree, printed once per program call traced (34 and
# 18 lines of a `dvc repro` log): nothing a user of this project can act on
warnings.filterwarnings("ignore", message="_check_is_size will be removed", category=FutureWarning)
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
# once per program exported (a `dvc repro` log line pair per program): the programs' mutated buffers are caches
# (attention K/V, the draft's context, DeltaNet state) that every generation writes before it reads them (a
# DeltaNet call at position 0 starts from zeros, models/deltanet.py), so their initial values need no serializing
warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected", category=UserWarning)
# printed by every command before its first line of output (4 lines a stage): torchao's CUDA-only kernel
# libraries, which a CPU build of torch cannot load, and torchao registering its enums with torch's pytree
logging.getLogger("torchao").addFilter(
    lambda r: not (r.getMessage().startswith("Failed to load") and "_C_" in r.getMessage() and not _has_cuda()))
logging.getLogger("torch.utils._pytree").addFilter(
    lambda r: "is an Enum subclass and is now natively supported" not in r.getMessage())


def show_progress() -> None:
    """The library reports progress through `logging` (a long export, llama.cpp's first build); a command (a stage,
    `dflash train-draft`, `dflash compare`) shows dflash_et's INFO lines on stdout, tagged with their module
    (`[lower] lowering target ...`), once: not also through the root logger, which a dependency configures on
    import (a second `INFO:dflash_et...` copy)."""
    log = logging.getLogger("dflash_et")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[%(module)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
