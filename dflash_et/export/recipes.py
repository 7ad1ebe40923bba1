"""The `export.quantize` and `export.draft_head` recipes: torchao's weights, made as each backend's kernels take them.

`loading.load_models` applies them (each decoder layer as it loads, then the rest), for the export and for
validate's eager twin of it alike.
"""

import copy

import torch

from dflash_et.export import by_rows
from dflash_et.export.config import QUANTIZE, ExportConfig
from dflash_et.models.draft import Draft


def quantize(model: torch.nn.Module, config: ExportConfig) -> None:
    """Quantize `model` in place with torchao, as `export.quantize` and (for a draft) `export.draft_head` say.

    XNNPACK (8da4w, 8da8w): int8 dynamic activations with int4 grouped / int8 per-channel weights on every
    Linear. MLX (4w): ExecuTorch's MLX LLM recipe (executorch/extension/llm/export/quantize.py `4w`, with
    backends/mlx/examples/llm/dflash/export.py quantizing Linears and the embedding alike): int4 weight-only,
    grouped, HQQ scales, on every Linear and the embedding, which MLX lowers to its quantized matmul and
    gather. A head tied to the embedding is tied again afterwards (as that recipe does), so it stays one tensor.
    Either quantizes a block of rows at a time (export.by_rows): the same values, without fp32 copies of the
    whole head.
    """
    if config.draft_head != "same" and isinstance(model, Draft):
        _int8_head(model)
    q = QUANTIZE[config.quantize]
    if q is None:
        return
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig

    grouped = q.weight_dtype == torch.int4
    granularity = PerGroup(config.group_size) if grouped else PerAxis(0)

    def to_quantize(module: torch.nn.Module, kinds: tuple[type, ...]) -> bool:
        """A module the recipe quantizes: of `kinds`, not done yet, and rows of whole groups (a DFlash2 draft's
        low-rank selector can have rows shorter than a group: they stay as they are, a few KB)."""
        return (isinstance(module, kinds) and not _quantized(module)
                and (not grouped or module.weight.shape[-1] % config.group_size == 0))

    if q.dynamic_activations:
        recipe = Int8DynamicActivationIntxWeightConfig(weight_dtype=q.weight_dtype, weight_granularity=granularity)
        for linear in [m for m in model.modules() if to_quantize(m, (torch.nn.Linear,))]:
            by_rows.quantize_affine(linear, recipe)
        return
    tied = hasattr(model, "lm_head") and model.lm_head.weight is model.embed_tokens.weight
    recipe = IntxWeightOnlyConfig(weight_dtype=q.weight_dtype, granularity=granularity,
                                  intx_choose_qparams_algorithm="hqq_scale_only")
    head = model.lm_head if tied else None  # quantized once, as the embedding
    with by_rows.hqq():
        quantize_(model, recipe, filter_fn=lambda module, _: module is not head
                  and to_quantize(module, (torch.nn.Linear, torch.nn.Embedding)))
    if tied:
        model.lm_head.weight = model.embed_tokens.weight


def _int8_head(draft: Draft) -> None:
    """export.draft_head=8da8w: the draft's head alone with int8 per-row weights and int8 dynamic activations
    (its own copy: the target's head, and a tied embedding, stay as they are)."""
    from torchao.quantization.granularity import PerAxis
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    head = draft.lm_head = copy.deepcopy(draft.lm_head)  # the target's, borrowed: in one program with it (single)
    if not _quantized(head):
        by_rows.quantize_affine(head, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8,
                                                                            weight_granularity=PerAxis(0)))


def _quantized(module: torch.nn.Module) -> bool:
    """Already quantized (export quantizes each layer as it loads, then the rest), or not loaded at all."""
    from torchao.utils import TorchAOBaseTensor

    return isinstance(module.weight, TorchAOBaseTensor) or module.weight.is_meta
