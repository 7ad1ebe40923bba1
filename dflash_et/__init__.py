"""dflash-et: build, validate and benchmark DFlash speculative decoding as ExecuTorch programs."""

import warnings

from dflash_et.threads import single_threaded_openmp

single_threaded_openmp()
# deprecations inside ExecuTorch's custom ops and torch's pytree, printed once per program call traced (34 and
# 18 lines of a `dvc repro` log): nothing a user of this project can act on
warnings.filterwarnings("ignore", message="_check_is_size will be removed", category=FutureWarning)
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
