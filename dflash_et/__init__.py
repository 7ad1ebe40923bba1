"""dflash-et: build, validate and benchmark DFlash speculative decoding as ExecuTorch programs."""

from dflash_et.threads import single_threaded_openmp

single_threaded_openmp()
