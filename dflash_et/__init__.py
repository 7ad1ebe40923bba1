"""dflash-et: build, validate and benchmark DFlash speculative decoding as ExecuTorch programs."""
