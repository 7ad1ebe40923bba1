"""Thread settings for processes that run ExecuTorch programs next to eager torch.

ExecuTorch's attention kernel (llama::custom_sdpa) runs its matrix products through torch's MKL
from inside ExecuTorch's own thread pool. A thread OpenMP did not start takes its team size from
OMP_NUM_THREADS, so unless that is 1 every pool worker fans out again and two cores carry four busy
threads, slowing every multi-token call (docs/measurements.md#threads has the figures). The variable only
works if it is set before torch loads OpenMP, which is why importing `dflash_et` sets it.
Eager work that wants every core (training) asks for them with `all_cores()` and gives them back.
"""

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator


def single_threaded_openmp() -> None:
    """Default OpenMP teams to one thread, unless the user chose otherwise."""
    if "OMP_NUM_THREADS" not in os.environ and "torch" in sys.modules:
        warnings.warn("torch was imported before dflash_et, so OMP_NUM_THREADS=1 comes too late: multi-token "
                      "program calls will run several times slower; import dflash_et first or set "
                      "OMP_NUM_THREADS=1", stacklevel=3)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@contextlib.contextmanager
def all_cores() -> Iterator[None]:
    """Eager torch on every core this process may use, then back to the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        yield
    finally:
        torch.set_num_threads(before)
