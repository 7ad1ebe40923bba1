"""Serializing a program without copying its weights into memory (#29): the emitter's constants as file ranges.

ExecuTorch's emitter copies every constant into a `bytes` (`bytes(ctypes array)` in `_tensor_spec_to_evalue`),
and its serializer deep-copies the program with them: two more copies of the weights, resident at once, over the
model itself. Under `upstream_patches.spilling`, a constant whose memory is a file's mapping (a safetensors
checkpoint read in its own dtype is mmapped, and torch.export never reads its pages) becomes a range of that file,
read later with `pread` (the page cache, not this process's resident set); any other constant (converted weights,
RoPE tables, caches) is written once to a spool file and becomes a range of that. ExecuTorch's `Cord` writes
`FileBackedData` pieces by streaming them, so the program written is byte for byte the same.

A quantized export makes new weights (torchao's int8-held int values and scales, a converted embedding) and
XNNPACK packs them once more: `Spiller.kept` moves a module's new weights to the spool as they are made, mapped back
read-only (page cache, not anonymous memory), and drops the pages that reading the old ones made resident (RssFile
counts in VmHWM); the delegates' constants (XNNPACK's packed bytes, MLX's tensors) become file ranges too, and
MLX's repacked weights go to the spool as they are made. This module is the spool; what hooks it into ExecuTorch
(its private internals, replaced for one release) is `upstream_patches`.
"""

import ctypes
import hashlib
import mmap
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from executorch.exir._serialize._cord import FileBackedData

from dflash_et.checkpoints.load import weight_files
from dflash_et.resident import Mappings, drop

CHUNK = 1 << 24
ALIGN = 64  # of each tensor kept in the spool: any dtype's view of it is aligned
SPILL_FROM_BYTES = 1 << 30  # of checkpoint weights: `pays` says why


def pays(target_dir: Path, draft_dir: Path) -> bool:
    """Whether an export of this pair should spill: its checkpoints' weights are SPILL_FROM_BYTES (1 GiB) or more.

    Without spilling, ExecuTorch's serializer peaks at about 2.5x the program's size, more where the export makes
    new weights (docs/measurements.md, "Export memory": 13.68 GiB for a 5.69 GB fp32 program; the worst measured,
    8da4w from a bf16 checkpoint, 11.9 bytes per parameter). Under 1 GiB of bf16 weights (0.5B parameters) that is
    at most about 6 GiB, which a build host has, while spilling still costs a spool file written and read back and
    ExecuTorch's internals replaced (`upstream_patches`); above it the copies decide whether an export fits at all
    (a 31B's bf16 weights are 62 GB). The checkpoints' size, not the free memory: the same pair exports the same
    way on every host, and the program is byte for byte the same either way.
    """
    return sum(f.stat().st_size for d in (target_dir, draft_dir) for f in weight_files(d)) >= SPILL_FROM_BYTES


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

    def in_memory(self, t: torch.Tensor) -> bool:
        """A tensor worth a place in the spool: in anonymous memory (loaded, not a file's mapping), contiguous, at
        least ALIGN bytes."""
        return (not t.is_meta and t.is_contiguous() and t.nbytes >= ALIGN
                and self._mapped(t.data_ptr(), t.nbytes) is None)

    @staticmethod
    def large(tensor: torch.Tensor) -> bool:
        """A 2-D weight over one CHUNK: packed (int4, two to a byte or eight to a uint32) a block of rows at a time
        (`by_blocks`), not with whole-size temporaries."""
        return tensor.dim() == 2 and tensor.nbytes > CHUNK

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
        self.keep([t for t in _tensors(module) if self.in_memory(t)])  # meta: a weight not loaded yet
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
