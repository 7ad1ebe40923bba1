"""Quantizing a weight a block of rows at a time, to the values torchao gives the whole of it (#29).

torchao quantizes a weight whole, in fp32: a 262144-row tied head or embedding at Gemma 4 31B's width makes
temporaries of 5.6 GB each, several alive at once, far more than the quantized model. Every recipe export uses
quantizes groups within a row, so a block of rows can be quantized alone: the affine ones (8da4w, 8da8w) by
torchao itself on each block, HQQ (MLX's 4w) by the same iterations on every block, stopped together, since
torchao stops when the largest change of any group's scale is small. `ROW_BLOCK` bounds the fp32 temporaries.
"""

from contextlib import contextmanager

import torch

from dflash_et.resident import drop

ROW_BLOCK = 1 << 26  # bytes of a weight's rows in fp32 quantized at once


def _step(weight: torch.Tensor) -> int:
    return max(1, ROW_BLOCK // (weight.shape[1] * 4))


def _read(weight: torch.Tensor, rows: torch.Tensor) -> None:
    """After a block `rows` of `weight` is read: its pages dropped (a file's mapping) where the weight has more
    than one block; a weight of one block's go with its layer's (frugal.Spiller.kept)."""
    if len(rows) < len(weight):
        drop(rows)


@torch.no_grad()  # a weight that requires grad would keep every block's temporaries in its graph
def quantize_affine(linear: torch.nn.Linear, recipe) -> None:
    """torchao's `quantize_(linear, recipe)` for a recipe whose groups lie within rows, a block of rows at a time."""
    from torchao.quantization import quantize_

    weight, inner, step = linear.weight, {}, _step(linear.weight)
    for start in range(0, len(weight), step):
        rows = weight[start:start + step]
        block = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
        block.weight = torch.nn.Parameter(rows, requires_grad=False)
        quantize_(block, recipe)
        _read(weight, rows)
        names, attributes = block.weight.__tensor_flatten__()
        for name in names:
            part = getattr(block.weight, name)
            if len(part) != len(rows):
                raise ValueError(f"{type(block.weight).__name__}.{name} is not one row per row of the weight")
            inner.setdefault(name, part.new_empty((len(weight), *part.shape[1:])))[start:start + len(rows)] = part
    whole = type(block.weight).__tensor_unflatten__(inner, attributes, weight.shape, weight.stride())
    linear.weight = torch.nn.Parameter(whole, requires_grad=False)


@torch.no_grad()
def _hqq(hp_tensor: torch.Tensor, block_size: list[int], qmin: int, qmax: int, *, iters: int = 20,
         stochastic: bool = False, early_stop_tol: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's `_choose_qparams_and_quantize_scale_only_hqq` (torchao/quantization/quant_primitives.py), its
    steps in its order, on a block of rows at a time; int8 qdata (torchao's int32 is only cast to int8)."""
    assert not stochastic and hp_tensor.ndim == 2 and block_size[0] == 1
    n, k = hp_tensor.shape
    group, eps, step = block_size[1], torch.finfo(torch.float32).eps, _step(hp_tensor)
    blocks = [slice(start, start + step) for start in range(0, n, step)]
    qabs = max(abs(qmin), abs(qmax)) or 1

    def grouped(rows: slice) -> torch.Tensor:
        out = hp_tensor[rows].to(torch.float32).contiguous().view(-1, k // group, group)
        _read(hp_tensor, hp_tensor[rows])
        return out

    scale = torch.cat([(grouped(rows).abs().amax(dim=2) / qabs).clamp_min(eps) for rows in blocks])
    previous = scale.clone()
    for _ in range(max(1, iters)):
        updated = []
        for rows in blocks:
            w = grouped(rows)
            q = (w / scale[rows].unsqueeze(-1)).round().clamp(qmin, qmax)
            num = (w * q).sum(dim=2, dtype=torch.float32)
            den = (q * q).sum(dim=2, dtype=torch.float32)
            updated.append(torch.where(den > 0, num / den, previous[rows]).clamp_min(eps).abs())
        scale = torch.cat(updated)
        if ((scale - previous).abs() / previous.clamp_min(eps)).max() < early_stop_tol:
            break
        previous = scale
    qdata = torch.empty((n, k), dtype=torch.int8)
    for rows in blocks:
        qdata[rows] = (grouped(rows) / scale[rows].unsqueeze(-1)).round().clamp(qmin, qmax).view(-1, k)
    return qdata, scale.to(hp_tensor.dtype)


@contextmanager
def hqq():
    """Within it, torchao's scale-only HQQ (IntxWeightOnlyConfig's `hqq_scale_only`) runs a block of rows at a time."""
    from torchao.quantization.quantize_.workflows.intx import intx_unpacked_to_int8_tensor as intx

    whole = intx._choose_qparams_and_quantize_scale_only_hqq
    intx._choose_qparams_and_quantize_scale_only_hqq = _hqq
    try:
        yield
    finally:
        intx._choose_qparams_and_quantize_scale_only_hqq = whole
