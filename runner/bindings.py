"""ctypes bindings of the runner's kernel library (built beside dflash_runner), to check its kernels against
ExecuTorch's own ops and time them. (The Python runtime registers the same kernels for the programs it runs, and calls
the host library: dflash_et/runtime/native.py.)"""

import ctypes
import math
from pathlib import Path

import torch

from runner.toolchain import BUILD


class LlamaKernels:
    """The runner's kernels of llama::update_cache, llama::custom_sdpa and llama::gated_delta_rule
    (libdflash_llama_ops.so, built beside it) on contiguous torch tensors: to check them against ExecuTorch's
    own ops and to time them."""

    DTYPES = {torch.float32: 6, torch.bfloat16: 15}  # ExecuTorch ScalarType codes

    def __init__(self, library: Path = BUILD / "libdflash_llama_ops.so"):
        self.lib = ctypes.CDLL(str(library))
        sizes, pointer = ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p
        self.lib.dflash_update_cache.argtypes = [pointer, sizes, pointer, sizes, ctypes.c_int64, ctypes.c_int]
        self.lib.dflash_custom_sdpa.argtypes = [pointer, sizes, pointer, pointer, sizes, pointer, ctypes.c_int64,
                                                ctypes.c_int, ctypes.c_double, pointer, ctypes.c_int]
        self.lib.dflash_gated_delta_rule.argtypes = [ctypes.POINTER(pointer), ctypes.POINTER(sizes),
                                                     ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]

    @staticmethod
    def _sizes(t: torch.Tensor):
        return (ctypes.c_int64 * t.dim())(*t.shape)

    def update_cache(self, value: torch.Tensor, cache: torch.Tensor, start: int) -> int:
        """Writes value [B,S,H,D] into cache [B,S_max,H,D] at start; 0, or the kernel's error code."""
        return self.lib.dflash_update_cache(value.data_ptr(), self._sizes(value), cache.data_ptr(), self._sizes(cache),
                                            start, self.DTYPES[value.dtype])

    def custom_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, causal: bool,
                    scale: float | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.full_like(q, float("nan"))
        error = self.lib.dflash_custom_sdpa(q.data_ptr(), self._sizes(q), k.data_ptr(), v.data_ptr(), self._sizes(k),
                                            None if mask is None else mask.data_ptr(), start, int(causal),
                                            math.nan if scale is None else scale, out.data_ptr(), self.DTYPES[q.dtype])
        if error:
            raise RuntimeError(f"llama::custom_sdpa failed with error {error:#x}")
        return out

    def gated_delta_rule(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor,
                         beta: torch.Tensor, initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [B,Hq,T,Dv], final_state [B,H,Dk,Dv]) of the recurrence from initial_state (left as it is)."""
        out = torch.full((*query.shape[:3], value.shape[3]), math.nan)
        final_state = torch.full(initial_state.shape, math.nan)
        tensors = (query, key, value, decay, beta, initial_state, out, final_state)
        n = len(tensors)
        error = self.lib.dflash_gated_delta_rule((ctypes.c_void_p * n)(*(t.data_ptr() for t in tensors)),
                                                 (ctypes.POINTER(ctypes.c_int64) * n)(*map(self._sizes, tensors)),
                                                 (ctypes.c_int * n)(*(t.dim() for t in tensors)),
                                                 (ctypes.c_int * n)(*(self.DTYPES[t.dtype] for t in tensors)))
        if error:
            raise RuntimeError(f"llama::gated_delta_rule failed with error {error:#x}")
        return out, final_state
