"""The runtime's log, errors only (dflash_et.runtime.runtime_log); its effect on a command's output is
tests/test_runner.py's test_the_runtimes_info_lines_are_not_shown_but_its_errors_are."""

import ctypes

from dflash_et.runtime import runtime_log


def test_without_the_runtime_library_nothing_is_filtered_and_nothing_fails(monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("libexecutorch.so: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert runtime_log.errors_only.__wrapped__() is False
