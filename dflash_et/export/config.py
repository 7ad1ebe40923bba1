"""The `export` section of params.yaml: its settings, what each may be, and the combinations refused."""

from dataclasses import dataclass

import torch

from dflash_et.errors import ExportError
from dflash_et.params import parse

BACKENDS = ("xnnpack", "portable", "mlx")
OPS_OF_BACKEND = {"xnnpack": "llama", "portable": "llama", "mlx": "mlx"}  # models.attention.CACHE_OF_OPS


@dataclass(frozen=True)
class Quantization:
    """One `export.quantize` recipe: which backend's kernels run it, and the torchao weights it makes."""

    backend: str
    weight_dtype: torch.dtype
    dynamic_activations: bool  # int8 dynamic activations on Linears (XNNPACK); else weight-only, embedding too
    kernels: str               # what runs it, for the error that refuses another backend


QUANTIZE: dict[str, Quantization | None] = {
    "none": None,
    "8da4w": Quantization("xnnpack", torch.int4, True, "its int8 dynamic-activation kernels"),
    "8da8w": Quantization("xnnpack", torch.int8, True, "its int8 dynamic-activation kernels"),
    # ExecuTorch's MLX LLM exports: int4 weight-only Linears and embedding (MLX's quantized matmul and
    # gather; XNNPACK lowers weight-only configs but computes wrong outputs)
    "4w": Quantization("mlx", torch.int4, False, "its int4 quantized matmul and gather kernels"),
}
MLX_GROUP_SIZES = (32, 64, 128)  # MLX's quantized kernels exist for these group sizes only
# Sliding-window layers of the target: a ring buffer of window + max_call - 1 rows (llama ops; MLX keeps
# full length), or a full-length cache under a window mask. Measured in docs/measurements.md: at long positions the
# ring is faster, since the masked kernel attends over every row.
SLIDING_CACHES = ("ring", "full")
# The draft's head multiplies its whole vocabulary for every block position: at fp32 on XNNPACK most of a draft
# call (`dflash profile`). Its precision only moves the proposals, never what is accepted (the target decides).
DRAFT_HEADS = ("same", "8da8w")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# What each export stage lowers, by layout: `single` is one program of all three methods (DFlash's two and
# the stock `forward`); the stages a layout does not use write their summary alone (package skips them).
PROGRAM_KINDS = ("target", "draft", "single")
LAYOUTS = {"pair": ("target", "draft"), "single": ("single",)}
CHOICES = {"backend": BACKENDS, "dtype": DTYPES, "sliding_cache": SLIDING_CACHES, "draft_head": DRAFT_HEADS,
           "layout": LAYOUTS}  # the settings that name one of a few


@dataclass(frozen=True)
class ExportConfig:
    """The `export` section of params.yaml."""

    backend: str = "xnnpack"
    dtype: str = "fp32"
    quantize: str = "none"
    group_size: int = 32
    max_seq_len: int = 512
    prefill_chunk: int = 64
    max_block_size: int | None = None
    shared_weights: bool = False
    sliding_cache: str = "ring"  # ring | full: how sliding-window layers (target, windowed draft) cache K/V
    draft_head: str = "same"     # same | 8da8w: the draft's head at the program's precision, or int8 (see quantize)
    draft_vocab: str | int = "full"  # full | N: the draft's head over the N tokens its target emits most (data.emitted)
    stock_forward: bool = True   # target.pte also has `forward` (logits alone) for ExecuTorch's stock runners (lower)
    layout: str = "pair"         # pair | single: target.pte + draft.pte, or one target.pte with the draft's method

    @classmethod
    def from_params(cls, params: dict) -> "ExportConfig":
        """The section (export.gguf, the package stage's, left out), checked."""
        config = parse(cls, params, "export", error=ExportError)
        config.check()
        return config

    def check(self) -> None:
        """Each setting one it may be, then the combinations no backend runs (each refused in one line)."""
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ExportError(f"export.{name}={value!r} does not exist; use one of {', '.join(allowed)}")
        self._check_quantize()
        self._check_draft_head()
        if self.shared_weights and self.backend == "mlx":  # its preprocess stores every constant in the .pte
            raise ExportError("export.shared_weights needs the xnnpack backend: the mlx delegate keeps every weight "
                              "inside its .pte; set export.shared_weights=false")
        if self.layout == "single" and self.shared_weights:
            raise ExportError("export.shared_weights stores the weights two programs share in shared.ptd; the single "
                              "layout's one program stores them once by itself: set export.shared_weights=false")
        if self.group_size < 1 or self.max_seq_len < 4 or self.prefill_chunk < 1:
            raise ExportError("export.group_size, export.prefill_chunk must be >= 1 and export.max_seq_len >= 4")

    def _check_quantize(self) -> None:
        if self.quantize not in QUANTIZE:
            hint = (" (torchao's weight-only configs lower to XNNPACK but compute wrong outputs; with mlx use 4w)"
                    if "w" in self.quantize and "da" not in self.quantize else "")
            raise ExportError(f"export.quantize={self.quantize!r} is not supported{hint}; "
                              f"use one of {', '.join(QUANTIZE)}")
        q = QUANTIZE[self.quantize]
        if q is None:
            return
        if q.backend != self.backend:
            fits = [name for name, other in QUANTIZE.items() if other is None or other.backend == self.backend]
            raise ExportError(f"export.quantize={self.quantize} needs the {q.backend} backend ({q.kernels}); set "
                              f"export.backend={q.backend}, or for {self.backend} export.quantize={' | '.join(fits)}")
        if q.dynamic_activations and self.dtype != "fp32":
            raise ExportError(f"export.quantize={self.quantize} computes in fp32 around its int8/int4 kernels; "
                              f"set export.dtype=fp32 (not {self.dtype})")
        if q.backend == "mlx" and self.group_size not in MLX_GROUP_SIZES:
            raise ExportError(f"export.group_size={self.group_size}: MLX's quantized kernels take groups of "
                              f"{', '.join(map(str, MLX_GROUP_SIZES))}; set one of them")

    def _check_draft_head(self) -> None:
        """export.draft_head and export.draft_vocab: the draft's own head."""
        if self.draft_head != "same" and (self.backend != "xnnpack" or self.dtype != "fp32" or self.shared_weights):
            raise ExportError(f"export.draft_head={self.draft_head} runs on XNNPACK's int8 dynamic-activation kernels in "
                              "an fp32 program and keeps its own head (shared.ptd cannot share it): set export.backend="
                              "xnnpack, export.dtype=fp32 and export.shared_weights=false, or export.draft_head=same")
        if self.draft_vocab != "full" and (not isinstance(self.draft_vocab, int) or self.draft_vocab < 1):
            raise ExportError(f"export.draft_vocab={self.draft_vocab!r} must be full or a number of tokens (8192)")
        if self.draft_vocab != "full" and self.shared_weights:
            raise ExportError("export.draft_vocab gives the draft a head of its own, which shared.ptd cannot share with "
                              "the target's: set export.shared_weights=false, or export.draft_vocab=full")
