"""What importing dflash_et does to a process: OpenMP defaults for processes that run programs (see
dflash_et/threads.py for the measurement), and the dependencies' import-time lines it keeps quiet."""

import os
import subprocess
import sys

import pytest
import torch

from dflash_et.threads import all_cores

SHOW = "import os, torch; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())"


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**clean, **env})


def test_importing_dflash_et_first_makes_openmp_single_threaded():
    assert python("import dflash_et; " + SHOW).stdout.split() == ["1", "1"]


def test_an_explicit_openmp_setting_is_kept():
    assert python("import dflash_et; " + SHOW, OMP_NUM_THREADS="2").stdout.split() == ["2", "2"]


def test_importing_torch_first_warns_with_the_fix():
    done = python("import torch, dflash_et")
    assert "import dflash_et first or set OMP_NUM_THREADS=1" in done.stderr


def test_all_cores_gives_the_threads_back_even_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), all_cores():
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        raise RuntimeError("training failed")
    assert torch.get_num_threads() == before


def test_importing_dflash_et_keeps_torchaos_import_lines_out_of_a_commands_output():
    """A CPU build of torch cannot load torchao's CUDA kernel libraries, and torchao registers its enums with a
    deprecated pytree call: 4 lines before every command's first line of output, none a user can act on."""
    out = python("import dflash_et, torchao, logging; logging.getLogger('torchao').warning('Failed to load kernels')")
    quiet = ("_C_mxfp8", "_C_cutlass", "is an Enum subclass")
    assert not [line for line in out.stderr.splitlines() if any(q in line for q in quiet)]
    assert "Failed to load kernels" in out.stderr  # torchao's other warnings still show
