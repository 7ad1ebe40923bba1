"""Lowering the eager target and draft to ExecuTorch programs, and `export_program`, the export stage's one call.

Each program carries its own metadata as constant methods (export.records), so a runner needs nothing but the
files. Shapes are dynamic: the target takes 1..max(prefill chunk, max block) tokens per call, the draft blocks of
2..max block and 1..max_seq_len-2 new context taps (a draft with a context window: fewer than its window).
`export.layout` pair writes target.pte and draft.pte; single writes one target.pte that holds the draft's method
too, as upstream's DFlash example does, storing the weights they share once. Without a draft (model.draft: none)
either layout writes target.pte alone.
"""

import logging
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from torch.export import Dim, export

from dflash_et.checkpoints.load import build_target, has_draft, load_config
from dflash_et.checkpoints.zlab import BLOCK_SIZE, BORROWED, draft_settings
from dflash_et.errors import ExportError
from dflash_et.export import frugal
from dflash_et.export.accounting import linear_weights, peak_memory
from dflash_et.export.config import LAYOUTS, PROGRAM_KINDS, ExportConfig
from dflash_et.export.loading import Loading, load_models
from dflash_et.export.records import metadata, recurrent
from dflash_et.export.upstream_patches import spilling
from dflash_et.files import write_json
from dflash_et.metadata import DRAFT_METHOD, STOCK_METHOD, TARGET_METHOD, method_name
from dflash_et.models.draft import Draft
from dflash_et.models.mlx_ops import ensure_mlx_backend
from dflash_et.models.target import LogitsOnly, Target

logger = logging.getLogger(__name__)

WEIGHTS_TAG = "weights"  # with export.shared_weights, the weights both programs use go to <kind>.ptd
# lifted parameter names of the borrowed modules (`p_lm_head_weight`, or quantized and unwrapped,
# `p_lm_head_parametrizations_weight_original0..2`)
SHARED_PREFIXES = tuple("p_" + name.removesuffix("weight").replace(".", "_") for name in BORROWED)


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
    most = config.max_seq_len - 2
    if model.context_window is not None:  # a windowed draft is fed only the taps it reads (runtime.generate)
        most = min(model.context_window - 1, most)
    n = Dim("context", min=1, max=most)
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


class _Within(torch.nn.Module):
    """The draft beside the target in one program: its buffers become `draft.*`, since methods that
    share mutable buffers (`share_mutable_buffers`) share every buffer of the same name, and the draft's
    KV caches are named as the target's are."""

    def __init__(self, draft: Draft):
        super().__init__()
        self.draft = draft

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor
                ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.draft(tokens, hidden, input_pos)


def methods(kind: str, target: Target | None, draft: Draft | None, config: ExportConfig) -> dict:
    """The methods a program of `kind` holds: name -> model (single without a draft: the target's alone).
    The target's `forward` (logits alone) is for ExecuTorch's stock runners (`TextLLMRunner` takes the first
    output to be logits and refuses more); `export.stock_forward=false` leaves it out, for half the target's
    lowering time."""
    out = {}
    if kind in ("target", "single"):
        out[TARGET_METHOD] = target
        if config.stock_forward:
            out[STOCK_METHOD] = LogitsOnly.of(target)
    if kind in ("draft", "single") and draft is not None:
        out[DRAFT_METHOD] = draft if kind == "draft" else _Within(draft)
    return out


def lower(programs: dict, config: ExportConfig, max_block: int, metadata: dict):
    """torch.export -> edge (with the backend's partitioner) -> ExecuTorch program manager, and op counts.

    `programs` are the program's methods (`methods`). Methods of one program keep one copy of their mutable
    buffers (`share_mutable_buffers`: the same name in both is one tensor, the target's KV cache in `target`
    and `forward`) and of every weight (the emitter and the delegates store a tensor's bytes once), but each
    is lowered on its own. The op counts are those of the first method, the one a DFlash runner calls most.
    """
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    if config.shared_weights and config.quantize != "none":
        from torchao.utils import unwrap_tensor_subclass

        # quantized weights are tensor subclasses that lowering unwraps into new, untagged placeholders;
        # unwrapped first, their placeholders exist (and carry the tag) from export on
        for model in programs.values():  # a LogitsOnly view holds its target's modules: left as unwrapped
            unwrap_tensor_subclass(model)
    exported = {}
    with torch.no_grad():
        for name, model in programs.items():
            args, dynamic = example_inputs(model.draft if isinstance(model, _Within) else model, config, max_block)
            exported[name] = export(model, args, dynamic_shapes=dynamic, strict=False)
    if config.shared_weights:  # tag the weights the delegate will hold, so it keeps them outside the .pte
        for node in (n for program in exported.values() for n in program.graph.nodes):
            if node.op == "placeholder" and _weight_tag(node):
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = WEIGHTS_TAG
    edge = to_edge_transform_and_lower(exported, constant_methods=metadata, **_edge_options(config.backend))
    info = get_delegation_info(edge.exported_program(next(iter(exported))).graph_module)
    ops = {"delegated": info.num_delegated_nodes, "portable": info.num_non_delegated_nodes,
           "delegate_calls": info.num_delegated_subgraphs}
    backend_config = ExecutorchBackendConfig(external_constants=_weight_tag if config.shared_weights else False,
                                             memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))
    return edge.to_executorch(backend_config), ops


def _weight_tag(node: torch.fx.Node) -> str | None:
    """The parameters both programs hold (the target's embedding and head, which the draft borrows) go
    to the shared data file; each program keeps its own layers, so nothing else can collide there."""
    return WEIGHTS_TAG if node.name.startswith(SHARED_PREFIXES) else None


def export_program(kind: str, target_dir: Path, draft_dir: Path, config: ExportConfig, out_dir: Path,
                   memory_report: Path | None = None) -> dict:
    """Write the program of `kind` (`PROGRAM_KINDS`; single: target.pte with the draft's method too) and
    `export.json` (a summary) into `out_dir`; returns the summary. A kind the layout does not use writes
    its summary alone, with no program (the export stages of both layouts are in one DVC graph).

    The weights are read in the export dtype, shard by shard, and quantized layer by layer as they
    arrive; exporting the draft alone reads only the target's embedding and head. The process's peak
    resident memory (the figure to size a build host by) goes to `memory_report`, not export.json:
    it varies run to run, and package, validate and bench read export.json.
    """
    config.check()
    if kind not in PROGRAM_KINDS:
        raise ExportError(f"{kind!r} is not a program to export; use one of {', '.join(PROGRAM_KINDS)}")
    if kind not in LAYOUTS[config.layout]:
        return _summary_alone(kind, config, out_dir, memory_report, f"not a program of export.layout={config.layout}")
    if kind == "draft" and not has_draft(draft_dir):
        return _summary_alone(kind, config, out_dir, memory_report, "model.draft is none: the target decodes alone")
    t0 = time.perf_counter()
    max_block = _max_block(target_dir, draft_dir, config)
    pte = out_dir / ("target.pte" if kind == "single" else f"{kind}.pte")
    out_dir.mkdir(parents=True, exist_ok=True)
    # weights and constants as file ranges, not copies, where that pays (frugal.pays); .ptd data (shared_weights)
    # is left as it was
    spills = not config.shared_weights and frugal.pays(target_dir, draft_dir)
    with spilling(out_dir, config.backend == "mlx") if spills else nullcontext() as spiller:
        loading = Loading.for_program(kind, config, max_block, spiller)
        loaded = load_models(target_dir, draft_dir, config, config.max_seq_len, loading)
        meta = metadata(kind, loaded, config, target_dir, draft_dir, max_block)
        logger.info(f"lowering {kind} to {config.backend} ({config.quantize}) ...")
        program, ops = lower(methods(kind, loaded[0], loaded[1], config), config, max_block, meta)
        with open(pte, "wb") as f:
            program.write_to_file(f)
    if config.shared_weights:
        program.write_tensor_data_to_file(out_dir)
        (out_dir / f"{WEIGHTS_TAG}.ptd").rename(out_dir / f"{kind}.ptd")
    models = {k: m for k, m in zip(("target", "draft"), loaded) if k in loading.quantized and m is not None}
    # no timings or memory in export.json: package, validate and bench depend on it, and must not rerun for them
    summary = {"program": pte.name, "bytes": pte.stat().st_size, "ops": ops,
               "linears": {k: linear_weights(m, config) for k, m in models.items()}, "config": asdict(config),
               "metadata": {k: v for k, v in meta.items() if k != method_name("vocab_ids")}}  # not N ids
    write_json(out_dir / "export.json", summary)
    memory = peak_memory(*models.values())
    if memory_report is not None:
        write_json(memory_report, memory)
    logger.info(f"{pte.name} {summary['bytes'] / 1e6:.1f} MB, {ops['delegated']} delegated / {ops['portable']} "
                f"portable ops, peak RSS {memory['peak_rss_bytes'] / 2**30:.2f} GiB ({memory['peak_bytes_per_parameter']:.2f} "
                f"bytes per parameter), {time.perf_counter() - t0:.0f} s")
    return summary | {"memory": memory}


def _summary_alone(kind: str, config: ExportConfig, out_dir: Path, memory_report: Path | None, why: str) -> dict:
    """What the export stage of a kind the layout does not use (or a draft's, without one) writes: its summary, no
    program."""
    summary = {"program": None, "config": asdict(config)}
    write_json(out_dir / "export.json", summary)
    if memory_report is not None:
        write_json(memory_report, {})
    logger.info(f"{kind}: {why}")
    return summary


def _max_block(target_dir: Path, draft_dir: Path, config: ExportConfig) -> int:
    """The longest block the programs take (export.max_block_size, else the draft's, or z-lab's without one),
    checked with the backend before anything loads."""
    trained = draft_settings(load_config(draft_dir)).block_size if has_draft(draft_dir) else BLOCK_SIZE
    max_block = config.max_block_size or trained
    if not 2 <= max_block <= config.max_seq_len - 2:
        raise ExportError(f"export.max_block_size={max_block} must be in 2..max_seq_len-2")
    # an MLX cache would fail to build for these layers (the target's modules on the meta device cost nothing, and
    # give unsupported checkpoints their usual error)
    if config.backend == "mlx" and recurrent(build_target(load_config(target_dir), [], 1, empty=True).args):
        raise ExportError("export.backend=mlx: this hybrid target's Gated DeltaNet layers export for xnnpack or "
                          "portable only; set export.backend=xnnpack")
    return max_block
