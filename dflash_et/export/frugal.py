"""Serializing a program without copying its weights into memory (#29): the emitter's constants as file ranges.

ExecuTorch's emitter copies every constant into a `bytes` (`bytes(ctypes array)` in `_tensor_spec_to_evalue`),
and its serializer deep-copies the program with them: two more copies of the weights, resident at once, over the
model itself. Under `spilling`, a constant whose memory is a file's mapping (a safetensors checkpoint read in its
own dtype is mmapped, and torch.export never reads its pages) becomes a range of that file, read later with
`pread` (the page cache, not this process's resident set); any other constant (converted weights, RoPE tables,
caches) is written once to a spool file and becomes a range of that. ExecuTorch's `Cord` writes `FileBackedData`
pieces by streaming them, so the program written is byte for byte the same.
"""

import bisect
import builtins
import ctypes
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from executorch.exir._serialize._cord import FileBackedData

CHUNK = 1 << 24


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
        self.maps: tuple[list[int], list[tuple[int, int, int, str]]] | None = None

    def close(self) -> None:
        os.close(self.fd)

    def _mapped(self, address: int, size: int) -> tuple[str, int] | None:
        """The file and offset `address`..+size is mapped from, by /proc/self/maps (None: anonymous memory)."""
        if self.maps is None:  # read once: the mappings of the weights do not change while emitting
            regions = []
            for line in Path("/proc/self/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith("(deleted)"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    regions.append((start, end, int(fields[2], 16), fields[5]))
            regions.sort()
            self.maps = ([r[0] for r in regions], regions)
        starts, regions = self.maps
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            return None
        start, end, offset, path = regions[i]
        if address + size > end or not os.path.isfile(path):
            return None
        return path, offset + address - start

    def range_of(self, array: ctypes.Array) -> FileRange:
        """A constant's bytes as a file range: where it is mapped from, or written to the spool."""
        address, size = ctypes.addressof(array), ctypes.sizeof(array)
        mapped = self._mapped(address, size)
        if mapped is not None:
            return FileRange(mapped[0], mapped[1], size)
        view = memoryview(array).cast("B")
        digest = hashlib.sha256(view)
        offset = self.end
        for at in range(0, size, CHUNK):
            os.pwrite(self.fd, view[at:at + CHUNK], offset + at)
        self.end += size
        return FileRange(str(self.spool), offset, size, digest.digest())


@contextmanager
def spilling(directory: Path | None = None):
    """Within it, ExecuTorch's emitter (`to_executorch`) keeps constants as file ranges, spooling those that no
    file holds under `directory` (default: the temp dir); the spool lives until the context ends, so write the
    program inside it."""
    from executorch.exir.emit import _emitter

    handle, name = tempfile.mkstemp(prefix="dflash-spool-", suffix=".bin", dir=directory)
    os.close(handle)
    spiller = Spiller(Path(name))

    def to_bytes(data=b"", *args):
        if isinstance(data, ctypes.Array) and not args:
            return spiller.range_of(data)
        return builtins.bytes(data, *args)

    def sha256(data=b""):
        return _Digest(data.sha256()) if isinstance(data, FileBackedData) else hashlib.sha256(data)

    shim = type("hashlib", (), {"sha256": staticmethod(sha256)})
    _emitter.bytes, _emitter.hashlib = to_bytes, shim
    try:
        yield spiller
    finally:
        del _emitter.bytes
        _emitter.hashlib = hashlib
        spiller.close()
        os.unlink(name)
