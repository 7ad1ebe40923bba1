"""What a program says about itself: the constant methods export writes and every runner reads.

The names mean what ExecuTorch's LLM runners (extension/llm/runner) and upstream's DFlash example
(backends/mlx/examples/llm/dflash) take them to mean, so a stock `TextLLMRunner` drives target.pte's
`forward` as it drives any LLM: `get_max_seq_len` is the most tokens one call takes, `get_max_context_len`
the KV cache's length, `get_max_block_len` the draft's longest block; a target also answers to the names
upstream's DFlash driver reads (`ALIASES`). The C++ runner spells the same names in runner/src/metadata.h
(a test holds the two to one list).
"""

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar

from dflash_et.errors import ProgramError

# target.pte's methods: the stock runners' `forward` (logits) and DFlash's `target` (logits and taps), which
# write the same KV cache, and the draft's `draft`, in draft.pte (export.layout pair) or beside them (single),
# as upstream's DFlash example names its methods
TARGET_METHOD, STOCK_METHOD, DRAFT_METHOD = "target", "forward", "draft"
UNPREFIXED = ("use_kv_cache", "enable_dynamic_shape")  # ExecuTorch's runners read these two without `get_`


def method_name(field: str) -> str:
    return field if field in UNPREFIXED else f"get_{field}"


class Metadata:
    """A typed record of constant methods: `constant_methods()` for export, `read(program)` for a runner."""

    ALIASES: ClassVar[dict[str, str]] = {}  # other tools' names for a field: name -> field

    def constant_methods(self) -> dict[str, Any]:
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if v is not None}
        return {method_name(k): v for k, v in values.items()} | {name: values[k] for name, k in self.ALIASES.items()}

    @classmethod
    def read(cls, program, where: str):
        """The record from a loaded `executorch.runtime` program; a required name it lacks is a one-line error."""
        names = set(program.method_names)
        values = {}
        for f in fields(cls):
            name = method_name(f.name)
            if name not in names:
                if f.default is MISSING:
                    raise ProgramError(f"{where} lacks {name}: it was exported by another tool or an older dflash-et; "
                                       "re-export it (dvc repro)")
                continue
            out = [v.item() if hasattr(v, "item") else v for v in program.load_method(name).execute([])]
            values[f.name] = tuple(out) if f.name.endswith("_ids") else out[0]
        return cls(**values)


def merged(*records: Metadata) -> dict[str, Any]:
    """The constant methods of one program holding several records' methods (export.layout single): a name
    they share must mean one value."""
    out: dict[str, Any] = {}
    for record in records:
        for name, value in record.constant_methods().items():
            if out.setdefault(name, value) != value:
                raise ValueError(f"{name} is {out[name]!r} for one method and {value!r} for another")
    return out


@dataclass(frozen=True)
class TargetMeta(Metadata):
    max_seq_len: int                    # most tokens in one call (the prefill chunk, or the longest verify)
    max_context_len: int                # the KV cache's length: positions 0..max_context_len-1
    vocab_size: int
    eos_ids: tuple[int, ...]
    target_layer_ids: tuple[int, ...]   # the decoder layers whose outputs `target` returns, concatenated
    checkpoint_id: int                  # fingerprint of the checkpoint it was made from
    uses_llama_custom_ops: bool         # llama::update_cache / custom_sdpa: their kernels must be registered
    use_kv_cache: bool = True
    enable_dynamic_shape: bool = True   # calls of 1..max_seq_len tokens (stock runners prefill in one call)
    bos_id: int | None = None
    temperature: float | None = None    # the checkpoint's recommended sampling (generation_config.json)
    top_p: float | None = None
    top_k: int | None = None
    recurrent_state: bool = False       # a hybrid target: calls go forward only (models.deltanet)
    verify_rows: int | None = None      # ... and one kept in part keeps at most this many of its tokens
    max_block_len: int | None = None    # a target exported without a draft (model.draft: none): its longest verify,
                                        # lookup proposals' block (with a draft, the draft's record says it)

    # upstream's DFlash driver (backends/mlx/examples/llm/runtime_meta.py) reads the cache length and its
    # prefill chunk (the most tokens a call takes) by these names
    ALIASES: ClassVar[dict[str, str]] = {"get_max_ctx_len": "max_context_len", "get_prefill_chunk_size": "max_seq_len"}


@dataclass(frozen=True)
class DraftMeta(Metadata):
    max_block_len: int                  # the longest block: the anchor and max_block_len-1 proposals
    max_context_len: int                # context positions its cache holds (the target's)
    mask_token_id: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    draft_checkpoint_id: int            # its own name: one program may hold the target's methods too
    target_checkpoint_id: int           # the target it was exported for: a mismatched pair fails on loading
    uses_llama_custom_ops: bool
    context_window: int | None = None   # every layer windowed: a call takes no tap older than its block's first
                                        # position minus context_window - 1 (fewer than context_window taps)
    selector_top_k: int | None = None   # a DFlash2 draft: it returns (candidates, unary, pair) with this many
                                        # candidates per position, not logits (runtime.sampling.Lattice)
    vocab_ids: tuple[int, ...] | None = None  # a reduced head (export.draft_vocab): the token id of each of the
                                        # N logits it returns (DFlash2: its candidates are token ids already)

