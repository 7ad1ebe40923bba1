"""What an export reports of itself beyond the program: the weights each call streams (a profile's roofline) and
the process's peak resident memory (the figure to size a build host by)."""

import resource
import sys
from pathlib import Path

import torch

from dflash_et.export.config import DTYPES, QUANTIZE, ExportConfig
from dflash_et.models.draft import Draft


def linear_weights(model: torch.nn.Module, config: ExportConfig) -> dict:
    """What one call computes and streams per token, for a profile's roofline (`dflash profile`): every
    Linear (the borrowed head too) multiplies each token by its weight; the embedding is a row lookup.
    `bytes` is the weights' size at the program's precision with their scales (int4: a bf16 scale per
    group, as XNNPACK packs them; int8: a float per row), which every call reads once."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    q = QUANTIZE[config.quantize]
    int8_head = model.lm_head if config.draft_head != "same" and isinstance(model, Draft) else None

    def size(m: torch.nn.Linear) -> float:
        w = m.weight
        if m is int8_head or (q is not None and q.weight_dtype == torch.int8):
            return w.numel() + 4 * w.shape[0]
        if q is None:
            return w.numel() * DTYPES[config.dtype].itemsize
        return w.numel() * (0.5 + 2 / config.group_size)

    return {"parameters": sum(m.weight.numel() for m in linears), "bytes": round(sum(map(size, linears)))}


def peak_memory(*models: torch.nn.Module) -> dict:
    """This process's peak resident memory so far, and per parameter of the exported models (a tensor they
    share counted once)."""
    peak = vm_hwm()
    parameters = sum(p.numel() for p in {id(p): p for m in models for p in m.parameters()}.values())
    return {"peak_rss_bytes": peak, "parameters": parameters, "peak_bytes_per_parameter": round(peak / parameters, 3)}


def vm_hwm(status: Path = Path("/proc/self/status")) -> int:
    """This process's own peak resident set in bytes (`VmHWM`). Not `ru_maxrss`: Linux carries that over an
    exec from the parent, so an export started by a bigger process (dvc, a test runner) reported the parent's
    peak. Where there is no /proc (macOS), ru_maxrss is all there is (bytes there, KiB on Linux)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # "VmHWM:  123456 kB"
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
