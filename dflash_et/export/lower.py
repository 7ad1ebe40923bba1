"""Lowering the eager target and draft to ExecuTorch programs.

Each program carries its own metadata as constant methods (dflash_et.metadata), so a
runner needs nothing but the files. Shapes are dynamic: the target takes 1..max(prefill chunk,
max block) tokens per call, the draft blocks of 2..max block and 1..max_seq_len-2 new context taps (a
draft with a context window: fewer than its window).
`export.layout` pair writes target.pte and draft.pte; single writes one target.pte that holds the
draft's method too, as upstream's DFlash example does, storing the weights they share once.
"""

import copy
import logging
import resource
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from torch.export import Dim, export

from dflash_et.checkpoints.load import (bos_id, build_target, checkpoint_id, eos_ids, load_config,
                                       recommended_sampling)
from dflash_et.checkpoints.pair import load_pair
from dflash_et.checkpoints.zlab import BORROWED, DraftSettings, draft_settings
from dflash_et.data.chat import tokenizer
from dflash_et.data.emitted import TOKEN_COUNTS, coverage, kept_ids, read_counts
from dflash_et.errors import ExportError
from dflash_et.export import by_rows
from dflash_et.export.frugal import Spiller, spilling
from dflash_et.files import write_json
from dflash_et.metadata import DRAFT_METHOD, STOCK_METHOD, TARGET_METHOD, DraftMeta, TargetMeta, merged, method_name
from dflash_et.models.block import ModelArgs
from dflash_et.models.deltanet import DeltaNetSpec
from dflash_et.models.draft import Draft, reduce_head
from dflash_et.models.mlx_ops import ensure_mlx_backend
from dflash_et.models.target import Target
from dflash_et.params import parse

logger = logging.getLogger(__name__)

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
# call (tools.profile_calls). Its precision only moves the proposals, never what is accepted (the target decides).
DRAFT_HEADS = ("same", "8da8w")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# What each export stage lowers, by layout: `single` is one program of all three methods (DFlash's two and
# the stock `forward`); the stages a layout does not use write their summary alone (package skips them).
PROGRAM_KINDS = ("target", "draft", "single")
LAYOUTS = {"pair": ("target", "draft"), "single": ("single",)}
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
        if self.backend not in BACKENDS:
            raise ExportError(f"export.backend={self.backend!r} does not exist; use one of {', '.join(BACKENDS)}")
        if self.quantize not in QUANTIZE:
            hint = (" (torchao's weight-only configs lower to XNNPACK but compute wrong outputs; with mlx use 4w)"
                    if "w" in self.quantize and "da" not in self.quantize else "")
            raise ExportError(f"export.quantize={self.quantize!r} is not supported{hint}; "
                              f"use one of {', '.join(QUANTIZE)}")
        q = QUANTIZE[self.quantize]
        if q is not None and q.backend != self.backend:
            fits = [name for name, other in QUANTIZE.items() if other is None or other.backend == self.backend]
            raise ExportError(f"export.quantize={self.quantize} needs the {q.backend} backend ({q.kernels}); set "
                              f"export.backend={q.backend}, or for {self.backend} export.quantize={' | '.join(fits)}")
        if self.dtype not in DTYPES:
            raise ExportError(f"export.dtype={self.dtype!r} does not exist; use one of {', '.join(DTYPES)}")
        if q is not None and q.dynamic_activations and self.dtype != "fp32":
            raise ExportError(f"export.quantize={self.quantize} computes in fp32 around its int8/int4 kernels; "
                              f"set export.dtype=fp32 (not {self.dtype})")
        if q is not None and q.backend == "mlx" and self.group_size not in MLX_GROUP_SIZES:
            raise ExportError(f"export.group_size={self.group_size}: MLX's quantized kernels take groups of "
                              f"{', '.join(map(str, MLX_GROUP_SIZES))}; set one of them")
        if self.shared_weights and self.backend == "mlx":  # its preprocess stores every constant in the .pte
            raise ExportError("export.shared_weights needs the xnnpack backend: the mlx delegate keeps every weight "
                              "inside its .pte; set export.shared_weights=false")
        if self.sliding_cache not in SLIDING_CACHES:
            raise ExportError(f"export.sliding_cache={self.sliding_cache!r} does not exist; use one of "
                              f"{', '.join(SLIDING_CACHES)}")
        if self.draft_head not in DRAFT_HEADS:
            raise ExportError(f"export.draft_head={self.draft_head!r} does not exist; use one of {', '.join(DRAFT_HEADS)}")
        if self.draft_head != "same" and (self.backend != "xnnpack" or self.dtype != "fp32" or self.shared_weights):
            raise ExportError(f"export.draft_head={self.draft_head} runs on XNNPACK's int8 dynamic-activation kernels in "
                              "an fp32 program and keeps its own head (shared.ptd cannot share it): set export.backend="
                              "xnnpack, export.dtype=fp32 and export.shared_weights=false, or export.draft_head=same")
        if self.draft_vocab != "full" and (not isinstance(self.draft_vocab, int) or self.draft_vocab < 1):
            raise ExportError(f"export.draft_vocab={self.draft_vocab!r} must be full or a number of tokens (8192)")
        if self.draft_vocab != "full" and self.shared_weights:
            raise ExportError("export.draft_vocab gives the draft a head of its own, which shared.ptd cannot share with "
                              "the target's: set export.shared_weights=false, or export.draft_vocab=full")
        if self.layout not in LAYOUTS:
            raise ExportError(f"export.layout={self.layout!r} does not exist; use one of {', '.join(LAYOUTS)}")
        if self.layout == "single" and self.shared_weights:
            raise ExportError("export.shared_weights stores the weights two programs share in shared.ptd; the single "
                              "layout's one program stores them once by itself: set export.shared_weights=false")
        if self.group_size < 1 or self.max_seq_len < 4 or self.prefill_chunk < 1:
            raise ExportError("export.group_size, export.prefill_chunk must be >= 1 and export.max_seq_len >= 4")


def quantize(model: torch.nn.Module, config: ExportConfig) -> None:
    """Quantize `model` in place with torchao, as `export.quantize` and (for a draft) `export.draft_head` say
    (`load_models` applies it, for the export and for validate's eager twin of it alike).

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


def load_models(target_dir: Path, draft_dir: Path, config: ExportConfig, max_seq_len: int, ops: str = "torch",
                quantized: tuple[str, ...] = ("target", "draft"), spiller: Spiller | None = None,
                **load) -> tuple[Target, Draft, DraftSettings]:
    """The target and the draft as programs of `config` hold them: weights read in its dtype and quantized by its
    recipe (`quantize`), each decoder layer as it loads, then the rest of the models named in `quantized` (the
    program's own); with a `spiller` (export), the weights each step makes go to its spool (frugal.Spiller.kept),
    and those outside the decoder layers are converted into it (frugal.Spiller.converted).
    `ops` is the op set: the backend's to export, `torch` for the eager twin validate compares the programs
    with; `load` as checkpoints.pair.load_pair takes it."""
    prepare = partial(_prepare, config=config, spiller=spiller)
    convert = None if spiller is None else spiller.converted
    target, draft, settings = load_pair(target_dir, draft_dir, max_seq_len, ops, DTYPES[config.dtype], prepare,
                                        convert=convert, **load)
    if config.draft_vocab != "full":
        reduce_head(draft, _draft_vocab(target_dir, draft_dir, config.draft_vocab, draft.args.vocab_size))
    for name, model in (("target", target), ("draft", draft)):
        if name in quantized:
            prepare(model)  # what is not in a decoder layer: the head, the embedding, the draft's fc
    return target, draft, settings


def _draft_vocab(target_dir: Path, draft_dir: Path, size: int, vocab_size: int) -> list[int]:
    """export.draft_vocab: the ids the draft's head keeps (data.emitted), every special and end-of-turn token among them."""
    tok = tokenizer(target_dir)
    always = {t for t in {*eos_ids(target_dir), *tok.all_special_ids, *tok.added_tokens_decoder} if t < vocab_size}
    counts = read_counts(draft_dir)
    ids = kept_ids(counts, size, vocab_size, always)
    share = coverage(counts, ids)
    logger.info(f"draft head: {size} of {vocab_size} tokens, " + (
        f"{share:.2%} of the {sum(counts.values())} its target emitted in the draft's training replies" if counts else
        f"the lowest ids ({draft_dir} has no {TOKEN_COUNTS}: a draft not trained here)"))
    return ids


def _prepare(module: torch.nn.Module, config: ExportConfig, spiller: Spiller | None) -> None:
    with nullcontext() if spiller is None else spiller.kept(module):
        quantize(module, config)


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


@contextmanager
def _returning_taps(model: torch.nn.Module, taps: bool | None):
    """A target exported for one of its methods: with the taps (`target`) or logits alone (`forward`)."""
    if taps is None:  # a draft
        yield
        return
    model.return_taps = taps
    try:
        yield
    finally:
        model.return_taps = True


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
    """The methods a program of `kind` holds: name -> (model, taps), taps as `_returning_taps` takes them.
    The target's `forward` (logits alone) is for ExecuTorch's stock runners (`TextLLMRunner` takes the first
    output to be logits and refuses more); `export.stock_forward=false` leaves it out, for half the target's
    lowering time."""
    out = {}
    if kind in ("target", "single"):
        out[TARGET_METHOD] = (target, True)
        if config.stock_forward:
            out[STOCK_METHOD] = (target, False)
    if kind in ("draft", "single"):
        out[DRAFT_METHOD] = (draft if kind == "draft" else _Within(draft), None)
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
        for model in {id(m): m for m, _ in programs.values()}.values():
            unwrap_tensor_subclass(model)
    exported = {}
    with torch.no_grad():
        for name, (model, taps) in programs.items():
            args, dynamic = example_inputs(model.draft if isinstance(model, _Within) else model, config, max_block)
            with _returning_taps(model, taps):
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


def metadata(kind: str, args: ModelArgs, config: ExportConfig, target_dir: Path, draft_dir: Path,
             max_block: int, settings: DraftSettings, context_window: int | None = None,
             vocab_ids: tuple[int, ...] | None = None) -> dict:
    """Everything a runner must know, inside the program itself: the constant methods of the records of
    the methods a program of `kind` holds (dflash_et.metadata); `context_window` and `vocab_ids` are the
    draft's (models.draft).

    Each carries the fingerprint of the checkpoint it was made from; the draft also carries its target's
    and the layers it reads, so a mismatched pair is caught when loading. A hybrid target (only) says
    `recurrent_state` and `verify_rows`: its calls must go forward (start at 0, or within the previous
    call), and one kept in part keeps at most its first `verify_rows` tokens, as every decode loop does
    (models.deltanet).
    """
    common = {"max_context_len": config.max_seq_len, "vocab_size": args.vocab_size,
              "target_layer_ids": tuple(settings.target_layer_ids), "uses_llama_custom_ops": config.backend != "mlx"}
    records = []
    if kind != "draft":
        hybrid = {"recurrent_state": True, "verify_rows": max_block} if recurrent(args) else {}
        records.append(TargetMeta(**common, **recommended_sampling(target_dir), **hybrid,
                                  max_seq_len=max(config.prefill_chunk, max_block), eos_ids=tuple(eos_ids(target_dir)),
                                  bos_id=bos_id(target_dir), checkpoint_id=checkpoint_id(target_dir)))
    if kind != "target":
        records.append(DraftMeta(**common, max_block_len=max_block, mask_token_id=settings.mask_token_id,
                                 draft_checkpoint_id=checkpoint_id(draft_dir), target_checkpoint_id=checkpoint_id(target_dir),
                                 context_window=context_window, vocab_ids=vocab_ids,
                                 selector_top_k=settings.selector[1] if settings.selector else None))
    return merged(*records)


def recurrent(args: ModelArgs) -> bool:
    """Whether a target has Gated DeltaNet layers (a hybrid model), whose state only goes forward."""
    return any(isinstance(spec, DeltaNetSpec) for spec in args.layers)


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
    if kind not in LAYOUTS[config.layout]:
        summary = {"program": None, "config": asdict(config)}
        write_json(out_dir / "export.json", summary)
        if memory_report is not None:
            write_json(memory_report, {})
        logger.info(f"{kind}: not a program of export.layout={config.layout}")
        return summary
    t0 = time.perf_counter()
    settings = draft_settings(load_config(draft_dir))
    max_block = config.max_block_size or settings.block_size
    if not 2 <= max_block <= config.max_seq_len - 2:
        raise ExportError(f"export.max_block_size={max_block} must be in 2..max_seq_len-2")
    # before loading: an MLX cache would fail to build for these layers (the target's modules on the meta device
    # cost nothing, and give unsupported checkpoints their usual error)
    if config.backend == "mlx" and recurrent(build_target(load_config(target_dir), [], 1, empty=True).args):
        raise ExportError("export.backend=mlx: this hybrid target's Gated DeltaNet layers export for xnnpack or "
                          "portable only; set export.backend=xnnpack")
    own = tuple(k for k in ("target", "draft") if kind in (k, "single"))
    pte = out_dir / ("target.pte" if kind == "single" else f"{kind}.pte")
    out_dir.mkdir(parents=True, exist_ok=True)
    # weights and constants as file ranges, not copies (frugal); .ptd data (shared_weights) is left as it was
    with nullcontext() if config.shared_weights else spilling(out_dir, config.backend == "mlx") as spiller:
        target, draft, settings = load_models(target_dir, draft_dir, config, config.max_seq_len,
                                              OPS_OF_BACKEND[config.backend], own, spiller,
                                              target_only=BORROWED if kind == "draft" else None,
                                              max_call=max(config.prefill_chunk, max_block), verify_call=max_block,
                                              ring=config.sliding_cache == "ring" and config.backend != "mlx",
                                              max_block=max_block)
        models = {k: m for k, m in (("target", target), ("draft", draft)) if k in own}
        vocab_ids = None if draft.vocab_ids is None else tuple(draft.vocab_ids.tolist())
        meta = metadata(kind, target.args, config, target_dir, draft_dir, max_block, settings, draft.context_window,
                        vocab_ids)
        logger.info(f"lowering {kind} to {config.backend} ({config.quantize}) ...")
        program, ops = lower(methods(kind, target, draft, config), config, max_block, meta)
        with open(pte, "wb") as f:
            program.write_to_file(f)
    if config.shared_weights:
        program.write_tensor_data_to_file(out_dir)
        (out_dir / f"{WEIGHTS_TAG}.ptd").rename(out_dir / f"{kind}.ptd")
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


def linear_weights(model: torch.nn.Module, config: ExportConfig) -> dict:
    """What one call computes and streams per token, for a profile's roofline (tools.profile_calls): every
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
