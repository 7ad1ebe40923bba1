"""Keeping the pages of mapped files out of this process's resident set (#29).

Linux counts the pages of a mapped file a process has read in its resident set (RssFile), and so in its peak
(VmHWM) until they are unmapped: converting or quantizing a 262144-row embedding read from a checkpoint's or the
spool's mapping makes the whole of it resident, though the file holds it and the page cache gives it back when
read again. `drop` tells the kernel this process no longer needs a mapped tensor's pages; anonymous memory is
never touched (there, MADV_DONTNEED would zero the data). Without /proc (macOS), nothing is known mapped and
nothing is dropped.
"""

import bisect
import ctypes
import mmap
import os
from pathlib import Path

import torch

MADV_DONTNEED = 4  # Linux's: a file mapping's pages leave the resident set (the file keeps the data)


class Mappings:
    """This process's file mappings as /proc/self/maps lists them when made: read once, for many lookups."""

    def __init__(self) -> None:
        regions = []
        try:
            lines = Path("/proc/self/maps").read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith("(deleted)"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                regions.append((start, end, int(fields[2], 16), fields[5]))
        regions.sort()
        self.starts, self.regions = [r[0] for r in regions], regions

    def file_of(self, address: int, size: int) -> tuple[str, int] | None:
        """The file and offset `address`..+size is mapped from (None: anonymous memory)."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0:
            return None
        start, end, offset, path = self.regions[i]
        if address + size > end or not os.path.isfile(path):
            return None
        return path, offset + address - start


def drop(tensor: torch.Tensor, mappings: Mappings | None = None) -> None:
    """Drop the resident pages of `tensor`'s memory if a file is mapped there (read again, they come back)."""
    if not tensor.nbytes or (mappings or Mappings()).file_of(tensor.data_ptr(), tensor.nbytes) is None:
        return
    start = tensor.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    end = tensor.data_ptr() + tensor.nbytes
    ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED)
