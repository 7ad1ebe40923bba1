"""Lowering the eager target and draft to ExecuTorch programs.

Each program carries its own metadata as constant methods (`get_max_seq_len`, ...), so a
runner needs nothing but the files. Shapes are dynamic: the target takes 1..max(prefill chunk,
max block) tokens per call, the draft blocks of 2..max block and 1..max_seq_len-2 new context taps.
"""

import os
import shutil
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch.export import Dim, export

from dflash_et.mlx_backend import ensure_mlx_backend
from dflash_et.model import Attention, CheckpointError, Draft, DraftSettings, Target, checkpoint_id, eos_ids

BACKENDS = ("xnnpack", "portable", "mlx")
QUANTIZE = {"none": None, "8da4w": torch.int4, "8da8w": torch.int8}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PROGRAM_KINDS = ("target", "draft")
WEIGHTS_TAG = "weights"  # with export.shared_weights, each program's weights go to <kind>.ptd


class ExportError(CheckpointError):
    """Export settings that cannot work, said in one line with the fix."""


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
    """Parameters (lifted as `p_*` placeholders), not caches or RoPE tables, go to the shared data file."""
    return WEIGHTS_TAG if node.name.startswith("p_") else None


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
    from dflash_et.checkpoint import load_pair

    config.check()
    t0 = time.perf_counter()
    target, draft, settings = load_pair(target_dir, draft_dir, config.max_seq_len)
    max_block = config.max_block_size or settings.block_size
    if not 2 <= max_block <= config.max_seq_len - 2:
        raise ExportError(f"export.max_block_size={max_block} must be in 2..max_seq_len-2")
    model = (target if kind == "target" else draft).to(DTYPES[config.dtype])
    quantize(model, config)
    if config.backend == "mlx":
        for module in model.modules():
            if isinstance(module, Attention):
                module.use_mlx_ops()
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
    summary = {"program": pte.name, "bytes": pte.stat().st_size, "ops": ops, "seconds": round(time.perf_counter() - t0, 1),
               "config": asdict(config), "metadata": meta}
    (out_dir / "export.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[export] {kind}.pte {summary['bytes'] / 1e6:.1f} MB, {ops['delegated']} delegated / {ops['portable']} portable ops, "
          f"{summary['seconds']} s", flush=True)
    return summary


def merge_weights(ptds: list[Path], out: Path) -> dict:
    """Merge the programs' .ptd files into one, storing every named tensor once.

    Delegated weights are keyed by content hash and the rest by module path (the same in both
    programs), so a key seen twice must hold the same bytes; anything else is a conflict.
    """
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    serializer = FlatTensorSerializer()
    buffers: list[bytes] = []
    named: dict[str, DataEntry] = {}
    for ptd in ptds:
        payload = serializer.deserialize(Cord(ptd.read_bytes()))
        for key, entry in payload.named_data.items():
            data = bytes(payload.buffers[entry.buffer_index])
            if key in named:
                if buffers[named[key].buffer_index] != data:
                    raise ExportError(f"{ptd}: tensor {key!r} differs from the one already in {ptds[0]}; "
                                      "the programs cannot share one weights file")
                continue
            named[key] = DataEntry(len(buffers), 64, entry.tensor_layout)
            buffers.append(data)
    with open(out, "wb") as f:
        serializer.serialize(DataPayload(buffers=buffers, named_data=named)).write_to_file(f)
    separate = sum(p.stat().st_size for p in ptds)
    return {"separate_bytes": separate, "shared_bytes": out.stat().st_size,
            "bytes_saved": separate - out.stat().st_size, "tensors": len(named)}


def package(build_dirs: list[Path], out: Path) -> dict:
    """Gather the programs into `out`: `<kind>.pte`, `shared.ptd` (merged) when weights are external, export.json."""
    summaries = {d.name: json.loads((d / "export.json").read_text()) for d in build_dirs}
    configs = {kind: s["config"] for kind, s in summaries.items()}
    if len({json.dumps({k: v for k, v in c.items() if k != "prefill_chunk"}, sort_keys=True)
            for c in configs.values()}) != 1:
        raise ExportError(f"the programs were exported with different settings {configs}; rerun both exports")
    for d in build_dirs:
        _link_or_copy(d / f"{d.name}.pte", out / f"{d.name}.pte")
    shared = None
    if configs[build_dirs[0].name]["shared_weights"]:
        shared = merge_weights([d / f"{d.name}.ptd" for d in build_dirs], out / "shared.ptd")
    summary = {"config": configs[build_dirs[0].name], "programs": summaries, "shared_weights": shared}
    (out / "export.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _link_or_copy(src: Path, dst: Path) -> None:
    """Programs can be GBs: hardlink when the filesystem allows (DVC's cache is read-only anyway)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
