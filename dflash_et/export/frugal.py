"""Serializing a program without copying its weights into memory (#29): the emitter's constants as file ranges.

ExecuTorch's emitter copies every constant into a `bytes` (`bytes(ctypes array)` in `_tensor_spec_to_evalue`),
and its serializer deep-copies the program with them: two more copies of the weights, resident at once, over the
model itself. Under `spilling`, a constant whose memory is a file's mapping (a safetensors checkpoint read in its
own dtype is mmapped, and torch.export never reads its pages) becomes a range of that file, read later with
`pread` (the page cache, not this process's resident set); any other constant (converted weights, RoPE tables,
caches) is written once to a spool file and becomes a range of that. ExecuTorch's `Cord` writes `FileBackedData`
pieces by streaming them, so the program written is byte for byte the same.

A quantized export makes new weights (torchao's int8-held int values and scales, a converted embedding) and
XNNPACK packs them once more: `Spiller.kept` moves a module's new weights to the spool as they are made, mapped back
read-only (page cache, not anonymous memory), and drops the pages that reading the old ones made resident (RssFile
counts in VmHWM); under `spilling`, the delegates' constants (XNNPACK's packed bytes, MLX's tensors) become file
ranges too. MLX's builder repacks every quantized weight into new constants (`make_or_get_constant`: int4 values
packed into uint32, biases) and holds them all until it serializes the graph: `spilling(mlx=True)` moves each to the
spool as it is made.
"""

import builtins
import ctypes
import hashlib
import importlib.metadata
import logging
import mmap
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from executorch.exir._serialize._cord import FileBackedData

from dflash_et.resident import Mappings, drop

CHUNK = 1 << 24
# The ExecuTorch release whose private internals `spilling` replaces (the emitter's `bytes` and `hashlib`, the named
# data store's `_tensor_to_bytes`, XNNPACK's `convert_to_qc4w`, MLX's builder and packers, and torch's storage and
# Parameter `__deepcopy__` while it lowers). Under any other, `spilling` patches nothing: the program is the same,
# its export takes the memory ExecuTorch's own serializer takes (docs/measurements.md#export-memory).
PATCHED_FOR = "1.5.1"
ALIGN = 64  # of each tensor kept in the spool: any dtype's view of it is aligned


class FileRange(FileBackedData):
    """`size` bytes of `path` from `offset`: what ExecuTorch's Cord and NamedDataStore take as file-backed data."""

    def __init__(self, path: str, offset: int, size: int, sha256: bytes | None = None) -> None:
        self._path, self._offset, self._size, self._sha256, self._finalizer = path, offset, size, sha256, None

    def _chunks(self, limit: int | None = None) -> Iterator[bytes]:
        """The range's bytes, a chunk at a time, with pread (no mapping: nothing becomes resident here)."""
        end = self._offset + (self._size if limit is None else min(limit, self._size))
        with open(self._path, "rb", buffering=0) as f:
            at = self._offset
            while at < end:
                chunk = os.pread(f.fileno(), min(CHUNK, end - at), at)
                if not chunk:
                    raise OSError(f"{self._path}: ends before byte {end} (changed while exporting?)")
                at += len(chunk)
                yield chunk

    def prefix(self, size: int) -> bytes:
        return b"".join(self._chunks(size))

    def sha256(self) -> bytes:
        if self._sha256 is None:
            digest = hashlib.sha256()
            for chunk in self._chunks():
                digest.update(chunk)
            self._sha256 = digest.digest()
        return self._sha256

    def to_bytes(self) -> bytes:
        return b"".join(self._chunks())

    def write_to_file(self, outfile) -> None:
        for chunk in self._chunks():
            outfile.write(chunk)

    def __deepcopy__(self, memo: dict) -> "FileRange":  # the serializer deep-copies the program: share, not copy
        return self


class _Digest:
    """What the emitter does with a constant's `hashlib.sha256`: `hexdigest()`."""

    def __init__(self, digest: bytes) -> None:
        self.digest = digest

    def hexdigest(self) -> str:
        return self.digest.hex()


class Spiller:
    """Turns the emitter's constants into `FileRange`s: of the file they are mapped from, or of `spool`."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool
        self.fd = os.open(spool, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.end = 0
        self.maps: Mappings | None = None  # read when needed: the weights' mappings change only while loading
        self.spooled: dict[bytes, FileRange] = {}  # by sha256: XNNPACK asks for each constant's bytes twice
        self.mappings: list[tuple[mmap.mmap, int, int]] = []  # of the spool (by `kept`), their addresses and sizes

    def close(self) -> None:
        os.close(self.fd)

    def _mapped(self, address: int, size: int) -> tuple[str, int] | None:
        """The file and offset `address`..+size is mapped from (None: anonymous memory)."""
        if self.maps is None:
            self.maps = Mappings()
        return self.maps.file_of(address, size)

    def range_of(self, array: ctypes.Array) -> FileRange:
        """A constant's bytes as a file range: where it is mapped from, or written to the spool (once)."""
        address, size = ctypes.addressof(array), ctypes.sizeof(array)
        mapped = self._mapped(address, size)
        if mapped is not None:
            return FileRange(mapped[0], mapped[1], size)
        view = memoryview(array).cast("B")
        digest = hashlib.sha256(view).digest()
        if digest not in self.spooled:
            self.spooled[digest] = FileRange(str(self.spool), self._write(view), size, digest)
        return self.spooled[digest]

    def _write(self, view: memoryview, align: int = 1) -> int:
        """Append bytes to the spool at a multiple of `align`; returns their offset."""
        offset = -(-self.end // align) * align
        for at in range(0, len(view), CHUNK):
            os.pwrite(self.fd, view[at:at + CHUNK], offset + at)
        self.end = offset + len(view)
        return offset

    @contextmanager
    def kept(self, module: torch.nn.Module):
        """Around a change of `module`'s weights (quantizing them): afterwards its weights that live in anonymous
        memory are in the spool, mapped back read-only, and the pages of the old ones' files that were read
        (the checkpoint's, quantizing read them) are dropped from the resident set."""
        self.maps = None  # loading mapped and unmapped checkpoint shards since
        before = _tensors(module)
        yield
        self.keep([t for t in _tensors(module) if not t.is_meta and t.is_contiguous() and t.nbytes >= ALIGN
                    and self._mapped(t.data_ptr(), t.nbytes) is None])  # meta: a weight not loaded yet
        self.release(before)

    def keep(self, tensors: list[torch.Tensor]) -> None:
        """Each tensor's bytes appended to the spool, and its data a read-only mapping of them (a storage of its
        own: ExecuTorch's serializers take a constant's whole storage)."""
        if not tensors:
            return
        start = -(-self.end // mmap.PAGESIZE) * mmap.PAGESIZE
        offsets = [self._write(memoryview(t.reshape(-1).view(torch.uint8).numpy()), ALIGN if i else mmap.PAGESIZE)
                   for i, t in enumerate(tensors)]
        mapped = self._map(start)
        for t, offset in zip(tensors, offsets):
            t.data = mapped(t.dtype, t.shape, offset)

    def converted(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`tensor` in `dtype`, converted into the spool (`by_blocks`): a big weight the program keeps unquantized,
        converted (8da4w's fp32 embedding from a bf16 checkpoint), never exists whole in memory."""
        if tensor.dtype == dtype or tensor.dim() == 0 or not tensor.numel():
            return tensor.to(dtype)
        return self.by_blocks(tensor, lambda rows: rows.to(dtype))

    def by_blocks(self, tensor: torch.Tensor, rowwise: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`rowwise(tensor)` for a function of each row alone, made a block of rows at a time into the spool and
        mapped back read-only, the pages of `tensor` (a file's mapping) dropped after each block."""
        start = -(-self.end // mmap.PAGESIZE) * mmap.PAGESIZE
        step = max(1, CHUNK // max(1, tensor[0].nbytes))
        maps, shape = Mappings(), None
        for at in range(0, len(tensor), step):
            rows = tensor[at:at + step]
            block = rowwise(rows).contiguous()
            shape = shape or (len(tensor), *block.shape[1:])
            self._write(memoryview(block.reshape(-1).view(torch.uint8).numpy()), mmap.PAGESIZE if at == 0 else 1)
            drop(rows, maps)
        return self._map(start)(block.dtype, torch.Size(shape), start)

    def _map(self, start: int):
        """The spool from `start` (page-aligned) to its end mapped read-only; returns a function making a tensor of
        (dtype, shape, spool offset) there."""
        mapping = mmap.mmap(self.fd, self.end - start, offset=start, access=mmap.ACCESS_READ)
        self.mappings.append((mapping, _read_only(mapping, torch.uint8, len(mapping), 0).data_ptr(), len(mapping)))
        self.maps = None  # a new mapping
        return lambda dtype, shape, offset: _read_only(mapping, dtype, shape.numel(), offset - start).view(shape)

    def holds(self, storage: torch.UntypedStorage) -> bool:
        """Whether a storage is (in) one of the spool's read-only mappings."""
        return any(at <= storage.data_ptr() < at + size for _, at, size in self.mappings)

    def release(self, tensors: list[torch.Tensor] = ()) -> None:
        """Drop the resident pages of the spool's mappings and of the file-mapped `tensors`: what reading them
        made resident, which the file gives back when read again."""
        for mapping, _, _ in self.mappings:
            mapping.madvise(mmap.MADV_DONTNEED)
        if tensors:
            maps = Mappings()
            for t in tensors:
                drop(t, maps)


def _mlx_builder() -> tuple[type, tuple]:
    """MLX's program builder, and the modules that call its `to_mlx_qparams` (each imported it by name)."""
    from dflash_et.models.mlx_ops import ensure_mlx_backend

    ensure_mlx_backend()
    from executorch.backends.mlx import ops, patterns
    from executorch.backends.mlx.builder import op_helpers
    from executorch.backends.mlx.builder.program_builder import MLXProgramBuilder

    return MLXProgramBuilder, (op_helpers, ops, patterns)


def _read_only(mapping: mmap.mmap, dtype: torch.dtype, count: int, offset: int) -> torch.Tensor:
    with warnings.catch_warnings():  # read-only on purpose: a write to a weight would be a bug, and crashes
        warnings.simplefilter("ignore")
        return torch.frombuffer(mapping, dtype=dtype, count=count, offset=offset)


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The plain tensors that hold a module's parameters' data (a quantized weight's inner qdata, scale, ...)."""
    out, todo = {}, list(module.parameters())
    while todo:
        t = todo.pop()
        if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
            todo += [getattr(t, name) for name in t.__tensor_flatten__()[0]]
        else:
            out[id(t)] = t
    return list(out.values())


@contextmanager
def spilling(directory: Path | None = None, mlx: bool = False):
    """Within it, ExecuTorch's emitter (`to_executorch`) and the XNNPACK and MLX delegates keep constants as file
    ranges, spooling those that no file holds under `directory` (default: the temp dir); the spool lives until
    the context ends, so load (`Spiller.kept`), lower and write the program inside it. `mlx`: a program lowered to
    MLX, whose builder's repacked weights go to the spool as they are made (importing its builder generates the
    MLX backend's serialization files once, so other backends leave it alone). It yields None, and patches
    nothing, under an ExecuTorch release other than PATCHED_FOR (one logged line)."""
    installed = importlib.metadata.version("executorch")
    if installed != PATCHED_FOR:
        logging.getLogger(__name__).info(f"executorch {installed} is not {PATCHED_FOR}, whose internals frugal export "
                                         "replaces: serializing as ExecuTorch does (more memory for large models)")
        yield None
        return
    from executorch.backends.xnnpack.operators import node_visitor
    from executorch.exir._serialize import _named_data_store
    from executorch.exir.emit import _emitter

    handle, name = tempfile.mkstemp(prefix="dflash-spool-", suffix=".bin", dir=directory)
    os.close(handle)
    spiller = Spiller(Path(name))

    def to_bytes(data=b"", *args):
        if isinstance(data, ctypes.Array) and not args:
            spilled = spiller.range_of(data)
            spiller.release()  # what XNNPACK read of the weights to pack them
            return spilled
        return builtins.bytes(data, *args)

    def tensor_to_bytes(tensor: torch.Tensor):  # MLX's constants
        if not tensor.is_contiguous() or not tensor.nbytes:
            return plain_tensor_to_bytes(tensor)
        return spiller.range_of((ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr()))

    def sha256(data=b""):
        return _Digest(data.sha256()) if isinstance(data, FileBackedData) else hashlib.sha256(data)

    # XNNPACK packs int4 values two to a byte with whole-size temporaries (3x the int8-held weight): by blocks
    plain_qc4w = node_visitor.NodeVisitor.convert_to_qc4w

    def qc4w(tensor: torch.Tensor) -> torch.Tensor:
        return spiller.by_blocks(tensor, plain_qc4w) if tensor.dim() == 2 and tensor.nbytes > CHUNK else \
            plain_qc4w(tensor)

    # lowering deep-copies programs, their weights too: those in the spool are read-only, so copies share them
    copying = {cls: cls.__deepcopy__ for cls in (torch.UntypedStorage, torch.nn.Parameter)}

    def deepcopy(data, memo: dict):
        kind = torch.UntypedStorage if isinstance(data, torch.UntypedStorage) else torch.nn.Parameter
        return data if spiller.holds(data if kind is torch.UntypedStorage else data.untyped_storage()) \
            else copying[kind](data, memo)

    builder, packers = _mlx_builder() if mlx else (None, ())
    plain_constant = builder.make_or_get_constant if mlx else None
    plain_qparams = packers[0].to_mlx_qparams if mlx else None

    def make_or_get_constant(self, name: str, tensor: torch.Tensor):
        new = name not in self.extra_constants
        slot = plain_constant(self, name, tensor)
        if new and type(tensor) is torch.Tensor and tensor.is_contiguous() and tensor.nbytes >= ALIGN \
                and spiller._mapped(tensor.data_ptr(), tensor.nbytes) is None:  # not fake, not in the spool yet
            spiller.keep([tensor])
            spiller.release()  # what repacking read of the quantized weights (themselves in the spool)
        return slot

    # MLX packs int4 values eight to a uint32 with whole-size temporaries (3x the int8-held weight): by blocks
    def mlx_qparams(qdata: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int,
                    compute_biases: bool = True, prepacked: bool = False):
        if prepacked or qdata.dim() != 2 or qdata.nbytes <= CHUNK:
            return plain_qparams(qdata, scale, zero_point, bits, compute_biases, prepacked)
        packed = spiller.by_blocks(qdata, lambda rows: plain_qparams(rows, scale, zero_point, bits, False)[0])
        return packed, plain_qparams(qdata[:1], scale, zero_point, bits, compute_biases)[1]  # biases: scales' alone

    shim = type("hashlib", (), {"sha256": staticmethod(sha256)})
    plain_tensor_to_bytes = _named_data_store._tensor_to_bytes
    for module in (_emitter, node_visitor):
        module.bytes, module.hashlib = to_bytes, shim
    _named_data_store._tensor_to_bytes = tensor_to_bytes
    node_visitor.NodeVisitor.convert_to_qc4w = staticmethod(qc4w)
    for cls in copying:
        cls.__deepcopy__ = deepcopy
    if mlx:
        builder.make_or_get_constant = make_or_get_constant
        for module in packers:
            module.to_mlx_qparams = mlx_qparams
    try:
        yield spiller
    finally:
        for module in (_emitter, node_visitor):
            del module.bytes
            module.hashlib = hashlib
        _named_data_store._tensor_to_bytes = plain_tensor_to_bytes
        node_visitor.NodeVisitor.convert_to_qc4w = staticmethod(plain_qc4w)
        for cls, plain in copying.items():
            cls.__deepcopy__ = plain
        if mlx:
            builder.make_or_get_constant = plain_constant
            for module in packers:
                module.to_mlx_qparams = plain_qparams
        spiller.close()
        os.unlink(name)
