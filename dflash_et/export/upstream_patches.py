"""ExecuTorch's and torch's private internals that frugal export replaces, all here, for the releases they were read in.

ExecuTorch's public API has no hook for keeping a program's constants as file ranges (export.frugal), so
`spilling` replaces, while it lasts:
- the emitter's and XNNPACK's `bytes` and `hashlib` (`exir.emit._emitter`, `xnnpack.operators.node_visitor`): a
  constant's bytes become a `FileRange`, hashed from its file;
- the named data store's `_tensor_to_bytes` (MLX's constants);
- XNNPACK's `NodeVisitor.convert_to_qc4w`: int4 packing a block of rows at a time into the spool;
- torch's `UntypedStorage.__deepcopy__` and `nn.Parameter.__deepcopy__`: lowering deep-copies programs, and a
  weight in the spool (read-only) is shared, not copied;
- for MLX, its builder's `make_or_get_constant` (each repacked weight to the spool as it is made) and
  `to_mlx_qparams` where its modules imported it (int4 packing by blocks of rows).
Each replacement was written against WRITTEN_FOR's releases. Under any other one `spilling` replaces nothing and
says so in one line: the export is ExecuTorch's own, the same program at the memory ExecuTorch's serializer takes.
"""

import builtins
import ctypes
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.metadata import version
from pathlib import Path

import torch
from executorch.exir._serialize._cord import FileBackedData

from dflash_et.export.frugal import Spiller

logger = logging.getLogger(__name__)

WRITTEN_FOR = {"executorch": "1.5.1", "torch": "2.13.0"}  # torch's: the two __deepcopy__ replaced
_ABSENT = object()


def mismatch() -> str | None:
    """The installed releases other than WRITTEN_FOR's, named (None: all are those)."""
    other = [f"{package} {version(package)} (not {wanted})" for package, wanted in WRITTEN_FOR.items()
             if version(package).split("+")[0] != wanted]  # torch's local part (+cpu) is its build, not its code
    return ", ".join(other) or None


@contextmanager
def spilling(directory: Path | None = None, mlx: bool = False) -> Iterator[Spiller | None]:
    """Within it, ExecuTorch's emitter (`to_executorch`) and the XNNPACK and MLX delegates keep constants as file
    ranges, spooling those that no file holds under `directory` (default: the temp dir); the spool lives until
    the context ends, so load (`Spiller.kept`), lower and write the program inside it. `mlx`: a program lowered to
    MLX, whose builder's repacked weights go to the spool as they are made (importing its builder generates the
    MLX backend's serialization files once, so other backends leave it alone). Under releases other than
    WRITTEN_FOR's it yields None and replaces nothing (one logged line)."""
    other = mismatch()
    if other is not None:
        logger.info(f"{other}: frugal export replaces internals of executorch {WRITTEN_FOR['executorch']} and torch "
                    f"{WRITTEN_FOR['torch']} only, so this export serializes as ExecuTorch does (more memory: about "
                    "2.5x the program's size)")
        yield None
        return
    handle, name = tempfile.mkstemp(prefix="dflash-spool-", suffix=".bin", dir=directory)
    os.close(handle)
    spiller = Spiller(Path(name))
    try:
        with ExitStack() as patches:
            _serializers(patches, spiller)
            _deep_copies(patches, spiller)
            if mlx:
                _mlx_builder(patches, spiller)
            yield spiller
    finally:
        spiller.close()
        os.unlink(name)


def _replace(patches: ExitStack, owner: object, name: str, value: object) -> None:
    """`owner.name = value` until `patches` closes; then as it was (deleted where `owner` itself had none: a
    module's builtin, a class's inherited method)."""
    plain = vars(owner).get(name, _ABSENT)
    setattr(owner, name, value)
    patches.callback(lambda: delattr(owner, name) if plain is _ABSENT else setattr(owner, name, plain))


class _Digest:
    """What the emitter does with a constant's `hashlib.sha256`: `hexdigest()`."""

    def __init__(self, digest: bytes) -> None:
        self.digest = digest

    def hexdigest(self) -> str:
        return self.digest.hex()


def _sha256(data=b""):
    return _Digest(data.sha256()) if isinstance(data, FileBackedData) else hashlib.sha256(data)


def _serializers(patches: ExitStack, spiller: Spiller) -> None:
    """The emitter's and XNNPACK's constant bytes (and their hashes), MLX's named data, XNNPACK's int4 packing."""
    from executorch.backends.xnnpack.operators import node_visitor
    from executorch.exir._serialize import _named_data_store
    from executorch.exir.emit import _emitter

    def to_bytes(data=b"", *args):
        if isinstance(data, ctypes.Array) and not args:
            spilled = spiller.range_of(data)
            spiller.release()  # what XNNPACK read of the weights to pack them
            return spilled
        return builtins.bytes(data, *args)

    plain_tensor_to_bytes = _named_data_store._tensor_to_bytes

    def tensor_to_bytes(tensor: torch.Tensor):  # MLX's constants
        if not tensor.is_contiguous() or not tensor.nbytes:
            return plain_tensor_to_bytes(tensor)
        return spiller.range_of((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr()))

    # XNNPACK packs int4 values two to a byte with whole-size temporaries (3x the int8-held weight): by blocks
    plain_qc4w = node_visitor.NodeVisitor.convert_to_qc4w

    def qc4w(tensor: torch.Tensor) -> torch.Tensor:
        return spiller.by_blocks(tensor, plain_qc4w) if spiller.large(tensor) else plain_qc4w(tensor)

    shim = type("hashlib", (), {"sha256": staticmethod(_sha256)})
    for module in (_emitter, node_visitor):
        _replace(patches, module, "bytes", to_bytes)
        _replace(patches, module, "hashlib", shim)
    _replace(patches, _named_data_store, "_tensor_to_bytes", tensor_to_bytes)
    _replace(patches, node_visitor.NodeVisitor, "convert_to_qc4w", staticmethod(qc4w))


def _deep_copies(patches: ExitStack, spiller: Spiller) -> None:
    """Lowering deep-copies programs, their weights too: those in the spool are read-only, so copies share them."""
    copying = {cls: cls.__deepcopy__ for cls in (torch.UntypedStorage, torch.nn.Parameter)}

    def deepcopy(data, memo: dict):
        kind = torch.UntypedStorage if isinstance(data, torch.UntypedStorage) else torch.nn.Parameter
        return data if spiller.holds(data if kind is torch.UntypedStorage else data.untyped_storage()) \
            else copying[kind](data, memo)

    for cls in copying:
        _replace(patches, cls, "__deepcopy__", deepcopy)


def _mlx_builder(patches: ExitStack, spiller: Spiller) -> None:
    """MLX's builder: its repacked weights to the spool as they are made, and int4 values packed eight to a uint32
    a block of rows at a time (whole-size temporaries, 3x the int8-held weight, before)."""
    from dflash_et.models.mlx_ops import ensure_mlx_backend

    ensure_mlx_backend()
    from executorch.backends.mlx import ops, patterns
    from executorch.backends.mlx.builder import op_helpers
    from executorch.backends.mlx.builder.program_builder import MLXProgramBuilder

    plain_constant, plain_qparams = MLXProgramBuilder.make_or_get_constant, op_helpers.to_mlx_qparams

    def make_or_get_constant(self, name: str, tensor: torch.Tensor):
        new = name not in self.extra_constants
        slot = plain_constant(self, name, tensor)
        if new and type(tensor) is torch.Tensor and spiller.in_memory(tensor):  # not fake, not in the spool yet
            spiller.keep([tensor])
            spiller.release()  # what repacking read of the quantized weights (themselves in the spool)
        return slot

    def mlx_qparams(qdata: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int,
                    compute_biases: bool = True, prepacked: bool = False):
        if prepacked or not spiller.large(qdata):
            return plain_qparams(qdata, scale, zero_point, bits, compute_biases, prepacked)
        packed = spiller.by_blocks(qdata, lambda rows: plain_qparams(rows, scale, zero_point, bits, False)[0])
        return packed, plain_qparams(qdata[:1], scale, zero_point, bits, compute_biases)[1]  # biases: scales' alone

    _replace(patches, MLXProgramBuilder, "make_or_get_constant", make_or_get_constant)
    for module in (op_helpers, ops, patterns):  # each imported it by name
        _replace(patches, module, "to_mlx_qparams", mlx_qparams)
