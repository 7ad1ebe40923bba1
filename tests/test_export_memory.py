"""The export's memory report: the process's own peak (VmHWM), not one inherited from its parent."""

import subprocess
import sys
from pathlib import Path

import pytest

from dflash_et.export.accounting import vm_hwm


def test_vm_hwm_reads_the_status_line(tmp_path: Path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  999 kB\nVmHWM:\t   1234 kB\nVmRSS:\t  1000 kB\n")
    assert vm_hwm(status) == 1234 * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc")
def test_a_child_reports_its_own_peak_not_its_parents():
    """ru_maxrss survives fork+exec; VmHWM starts afresh: the child of a 1.5 GiB parent reports its own peak."""
    ballast = bytearray(3 << 29)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # resident
    code = ("import resource; from dflash_et.export.accounting import vm_hwm; "
            "print(vm_hwm(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    own, inherited = map(int, out.split())
    assert inherited >= 3 << 29 > own  # the old figure was the parent's
    assert vm_hwm() >= 3 << 29
