"""Lowering the eager target and draft to ExecuTorch programs.

Each program carries its own metadata as constant methods (`get_max_seq_len`, ...), so a
runner needs nothing but the files. Shapes are dynamic: the target takes 1..max(prefill chunk,
max block) tokens per call, the draft blocks of 2..max block and 1..max_seq_len-2 new context taps.
"""

import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch.export import Dim, export

from dflash_et.checkpoints.check import load_pair
from dflash_et.checkpoints.load import checkpoint_id, eos_ids
from dflash_et.checkpoints.zlab import BORROWED, DraftSettings
from dflash_et.errors import ExportError
from dflash_et.models.draft import Draft
from dflash_et.models.mlx_ops import ensure_mlx_backend
from dflash_et.models.target import Target

BACKENDS = ("xnnpack", "portable", "mlx")
CACHE_OF_BACKEND = {"xnnpack": "llama", "portable": "llama", "mlx": "mlx"}  # models.attention.CACHES
QUANTIZE = {"none": None, "8da4w": torch.int4, "8da8w": torch.int8}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PROGRAM_KINDS = ("target", "draft")
WEIGHTS_TAG = "weights"  # with export.shared_weights, the weights both programs use go to <kind>.ptd
# lifted parameter names of the borrowed modules (`p_lm_head_weight`, or quantized and unwrapped,
# `p_lm_head_parametrizations_weight_original0..2`)
SHARED_PREFIXES = tuple("p_" + name.removesuffix("weight").replace(".", "_") for name in BORROWED)


@dataclass(frozen=True)
class ExportConfig:
    """The `export` section of params.yaml."""

    backend: str = "xnnpack"
    dtype: str = "fp32"
    quantize: str = "none"
    group_size: int = 32
    max_seq_len: int = 1024
    prefill_chunk: int = 64
    max_block_size: int | None = None
    shared_weights: bool = False

    @classmethod
    def from_params(cls, params: dict) -> "ExportConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ExportError(f"unknown export params {unknown}; known: {sorted(known)}")
        config = cls(**params)
        config.check()
        return config

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ExportError(f"export.backend={self.backend!r} does not exist; use one of {', '.join(BACKENDS)}")
        if self.quantize not in QUANTIZE:
            hint = (" (torchao's weight-only configs lower to XNNPACK but compute wrong outputs)"
                    if "w" in self.quantize and "da" not in self.quantize else "")
            raise ExportError(f"export.quantize={self.quantize!r} is not supported{hint}; "
                              f"use one of {', '.join(QUANTIZE)}")
        if self.quantize != "none" and self.backend != "xnnpack":
            raise ExportError(f"export.quantize={self.quantize} needs the xnnpack backend (its int8 dynamic-"
                              f"activation kernels); {self.backend} cannot run it: set export.quantize=none")
        if self.dtype not in DTYPES:
            raise ExportError(f"export.dtype={self.dtype!r} does not exist; use one of {', '.join(DTYPES)}")
        if self.quantize != "none" and self.dtype != "fp32":
            raise ExportError(f"export.quantize={self.quantize} computes in fp32 around its int8/int4 kernels; "
                              f"set export.dtype=fp32 (not {self.dtype})")
        if self.group_size < 1 or self.max_seq_len < 4 or self.prefill_chunk < 1:
            raise ExportError("export.group_size, export.prefill_chunk must be >= 1 and export.max_seq_len >= 4")


def quantize(model: torch.nn.Module, config: ExportConfig) -> None:
    """8-bit dynamic activations with int4/int8 grouped weights on every Linear (torchao, XNNPACK kernels)."""
    if QUANTIZE[config.quantize] is None:
        return
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    weight_dtype = QUANTIZE[config.quantize]
    granularity = PerGroup(config.group_size) if weight_dtype == torch.int4 else PerAxis(0)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=weight_dtype, weight_granularity=granularity))


def example_inputs(model: Target | Draft, config: ExportConfig, max_block: int):
    """Example arguments and their dynamic dims for `torch.export`."""
    if isinstance(model, Target):
        t = Dim("tokens", min=1, max=max(config.prefill_chunk, max_block))
        args = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2))
        return args, ({1: t}, {0: t})
    # The block is the anchor plus 1..max_block-1 proposals: a derived dim, so that the draft's
    # `x[:, 1:]` has a root size and nothing needs to specialize it.
    proposals = Dim("proposals", min=1, max=max_block - 1)
    b = proposals + 1
    n = Dim("context", min=1, max=config.max_seq_len - 2)
    width = model.fc.in_features
    args = (torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, width, dtype=model.fc.weight.dtype), torch.arange(2))
    return args, ({1: b}, {1: n}, {0: n})


def _edge_options(backend: str) -> dict:
    """Partitioner, passes and edge config of a backend (portable: none, every op on ExecuTorch's CPU kernels)."""
    from executorch.exir import EdgeCompileConfig

    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return {"partitioner": [XnnpackPartitioner()], "compile_config": EdgeCompileConfig(_check_ir_validity=False)}
    if backend == "mlx":
        ensure_mlx_backend()
        from executorch.backends.mlx.partitioner import MLXPartitioner
        from executorch.backends.mlx.passes import get_default_passes

        return {"partitioner": [MLXPartitioner()], "transform_passes": get_default_passes(),
                "compile_config": EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True)}
    return {"compile_config": EdgeCompileConfig(_check_ir_validity=False)}


def lower(model: torch.nn.Module, config: ExportConfig, max_block: int, metadata: dict):
    """torch.export -> edge (with the backend's partitioner) -> ExecuTorch program manager, and op counts."""
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    args, dynamic = example_inputs(model, config, max_block)
    if config.shared_weights and config.quantize != "none":
        from torchao.utils import unwrap_tensor_subclass

        # quantized weights are tensor subclasses that lowering unwraps into new, untagged placeholders;
        # unwrapped first, their placeholders exist (and carry the tag) from export on
        unwrap_tensor_subclass(model)
    with torch.no_grad():
        program = export(model, args, dynamic_shapes=dynamic, strict=False)
    if config.shared_weights:  # tag the weights the delegate will hold, so it keeps them outside the .pte
        for node in program.graph.nodes:
            if node.op == "placeholder" and _weight_tag(node):
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = WEIGHTS_TAG
    edge = to_edge_transform_and_lower(program, constant_methods=metadata, **_edge_options(config.backend))
    info = get_delegation_info(edge.exported_program().graph_module)
    ops = {"delegated": info.num_delegated_nodes, "portable": info.num_non_delegated_nodes,
           "delegate_calls": info.num_delegated_subgraphs}
    backend_config = ExecutorchBackendConfig(external_constants=_weight_tag if config.shared_weights else False)
    return edge.to_executorch(backend_config), ops


def _weight_tag(node: torch.fx.Node) -> str | None:
    """The parameters both programs hold (the target's embedding and head, which the draft borrows) go
    to the shared data file; each program keeps its own layers, so nothing else can collide there."""
    return WEIGHTS_TAG if node.name.startswith(SHARED_PREFIXES) else None


def metadata(kind: str, model: Target | Draft, config: ExportConfig, target_dir: Path, draft_dir: Path,
             max_block: int, settings: DraftSettings) -> dict:
    """Constant methods: everything a runner must know, inside the program itself.

    Each program carries the fingerprint of the checkpoint it was made from; the draft also carries
    its target's and the layers it reads, so a mismatched pair is caught when loading.
    """
    common = {"get_max_seq_len": config.max_seq_len, "get_vocab_size": model.args.vocab_size,
              "get_target_layer_ids": settings.target_layer_ids,
              "get_uses_llama_custom_ops": config.backend != "mlx"}
    if kind == "target":
        return common | {"get_checkpoint_id": checkpoint_id(target_dir), "get_eos_ids": eos_ids(target_dir),
                         "get_max_chunk": max(config.prefill_chunk, max_block)}
    return common | {"get_checkpoint_id": checkpoint_id(draft_dir), "get_target_checkpoint_id": checkpoint_id(target_dir),
                     "get_mask_token_id": settings.mask_token_id, "get_max_block_size": max_block,
                     "get_max_context": config.max_seq_len - 2}


def export_program(kind: str, target_dir: Path, draft_dir: Path, config: ExportConfig, out_dir: Path) -> dict:
    """Write `<kind>.pte` and `export.json` (a summary) into `out_dir`; returns the summary."""
    config.check()
    t0 = time.perf_counter()
    target, draft, settings = load_pair(target_dir, draft_dir, config.max_seq_len, CACHE_OF_BACKEND[config.backend])
    max_block = config.max_block_size or settings.block_size
    if not 2 <= max_block <= config.max_seq_len - 2:
        raise ExportError(f"export.max_block_size={max_block} must be in 2..max_seq_len-2")
    model = (target if kind == "target" else draft).to(DTYPES[config.dtype])
    quantize(model, config)
    meta = metadata(kind, model, config, target_dir, draft_dir, max_block, settings)
    print(f"[export] lowering {kind} to {config.backend} ({config.quantize}) ...", flush=True)
    program, ops = lower(model, config, max_block, meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    pte = out_dir / f"{kind}.pte"
    with open(pte, "wb") as f:
        program.write_to_file(f)
    if config.shared_weights:
        program.write_tensor_data_to_file(out_dir)
        (out_dir / f"{WEIGHTS_TAG}.ptd").rename(out_dir / f"{kind}.ptd")
    # no timings in export.json: package, validate and bench depend on it, and must not rerun for a clock
    summary = {"program": pte.name, "bytes": pte.stat().st_size, "ops": ops, "config": asdict(config), "metadata": meta}
    (out_dir / "export.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[export] {kind}.pte {summary['bytes'] / 1e6:.1f} MB, {ops['delegated']} delegated / {ops['portable']} portable ops, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return summary
