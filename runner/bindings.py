"""ctypes bindings of the runner's test libraries (built beside dflash_runner): its kernels, to check them
against ExecuTorch's own ops and time them, its auto planner, to hold it to adaptive.py's choices, and its walk
through a DFlash2 lattice, to hold it to sampling.py's."""

import ctypes
import math
from pathlib import Path

import torch

from dflash_et.errors import UserError
from dflash_et.runtime.sampling import Lattice
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


class CppPlanner:
    """The runner's auto planner (libdflash_planner.so, built beside it) behind `AdaptivePlanner`'s hooks, so
    that a test can give both the same rounds and compare their choices."""

    def __init__(self, curve: Path, programs: str, max_block: int, library: Path = BUILD / "libdflash_planner.so"):
        """Over the cost curve file `curve`, checked to be of `programs` as the runner checks it."""
        self.lib = ctypes.CDLL(str(library))
        self.lib.dflash_planner_new.restype = ctypes.c_void_p
        self.lib.dflash_planner_new.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p,
                                                ctypes.c_size_t]
        self.lib.dflash_planner_block.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self.lib.dflash_planner_block.restype = ctypes.c_int64
        self.lib.dflash_planner_verify_count.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                         ctypes.c_int64, ctypes.c_int64]
        self.lib.dflash_planner_verify_count.restype = ctypes.c_int64
        self.lib.dflash_planner_observe.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_double]
        self.lib.dflash_planner_learned.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
        self.lib.dflash_planner_free.argtypes = [ctypes.c_void_p]
        error = ctypes.create_string_buffer(1024)
        self._planner = self.lib.dflash_planner_new(str(curve).encode(), programs.encode(), max_block, error,
                                                    len(error))
        if not self._planner:
            raise UserError(error.value.decode())

    def block(self, pos: int, room: int) -> int:
        return self.lib.dflash_planner_block(self._planner, pos, room)

    def verify_count(self, draft_logits: torch.Tensor, pos: int) -> int:
        logits = draft_logits.float().contiguous()
        return self.lib.dflash_planner_verify_count(self._planner, logits.data_ptr(), *logits.shape, pos)

    def observe(self, verified: int, accepted: int, seconds: float) -> None:
        self.lib.dflash_planner_observe(self._planner, verified, accepted, seconds)

    def learned(self) -> tuple[float, float]:
        """(saving, per_call): AdaptivePlanner's attributes of those names."""
        out = (ctypes.c_double * 2)()
        self.lib.dflash_planner_learned(self._planner, out)
        return out[0], out[1]

    def __del__(self) -> None:
        self.lib.dflash_planner_free(self._planner)


class CppWalk:
    """The runner's walk through a DFlash2 lattice (`Sampler::walk`, libdflash_sampling.so, built beside it), to
    compare with `sampling.walk` on the same lattice."""

    def __init__(self, library: Path = BUILD / "libdflash_sampling.so"):
        self.lib = ctypes.CDLL(str(library))
        pointer = ctypes.c_void_p
        self.lib.dflash_walk.argtypes = [pointer, pointer, pointer, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_double, ctypes.c_int, ctypes.c_uint64, pointer, pointer, pointer]

    def __call__(self, lattice: Lattice, vocab_size: int, temperature: float = 0.0, sample: bool = False,
                 seed: int = 0) -> tuple[list[int], torch.Tensor | None, torch.Tensor]:
        """As `Sampler.walk` of a sampler with these settings: (path, q [P, V] for sampled proposals else None,
        the scores [P, k] each choice was made from)."""
        candidates, unary, pair = (lattice.candidates.long().contiguous(), lattice.unary.float().contiguous(),
                                   lattice.pair.float().contiguous())
        positions, k = candidates.shape
        path, scores = torch.zeros(positions, dtype=torch.long), torch.zeros(positions, k)
        q = torch.zeros(positions, vocab_size)
        self.lib.dflash_walk(candidates.data_ptr(), unary.data_ptr(), pair.data_ptr(), positions, k, vocab_size,
                             temperature, int(sample), seed, path.data_ptr(), scores.data_ptr(), q.data_ptr())
        return path.tolist(), q if temperature > 0 and sample else None, scores
