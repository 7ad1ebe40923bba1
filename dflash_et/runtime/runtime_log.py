"""ExecuTorch's runtime log, errors only.

The runtime logs at Info what no user acts on: its thread pool's five `[cpuinfo_utils.cpp]` lines, before the
first answer of every command that loads a program. Its printer is a PAL function (platform.h: the table
`get_pal_impl` returns); `errors_only` puts a filter in front of it that passes errors and fatal messages alone
(runner/src/main.cpp keeps the same rule for the C++ runner). It sets the table's printer in place: the Python
bindings registered their PAL already, and `register_pal` logs a line of its own for each later call. Where the
runtime library or its PAL symbol is not found (another ExecuTorch build), the lines stay and nothing else changes.
"""

import atexit
import ctypes
from functools import cache
from pathlib import Path

QUIET_LEVELS = (ord("D"), ord("I"))  # et_pal_log_level_t: debug and info
_PRINTER = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                            ctypes.c_char_p, ctypes.c_size_t)
_GET_PAL = "_ZN10executorch7runtime12get_pal_implEv"  # executorch::runtime::get_pal_impl()


class _PalImpl(ctypes.Structure):
    """executorch::runtime::PalImpl: the PAL's function pointers, then the name of the file that registered it."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("init", "abort", "current_ticks", "ticks_to_ns_multiplier",
                                                     "emit_log_message", "allocate", "free", "source_filename")]


@cache
def errors_only() -> bool:
    """Filter the runtime's log to errors from now on (once per process); whether it could."""
    import executorch.runtime  # loads the runtime library: the CDLL below is that same copy

    try:
        get_pal = getattr(ctypes.CDLL(str(Path(executorch.runtime.__file__).parents[1] / "lib" / "libexecutorch.so")),
                          _GET_PAL)
    except (OSError, AttributeError):
        return False
    get_pal.restype = ctypes.POINTER(_PalImpl)
    pal = get_pal().contents
    runtime_printer = pal.emit_log_message
    printer = _PRINTER(runtime_printer)

    @_PRINTER
    def print_errors(timestamp, level, filename, function, line, message, length):
        if level not in QUIET_LEVELS:
            printer(timestamp, level, filename, function, line, message, length)

    errors_only.filter = print_errors  # the runtime holds a pointer to it: it must live as long as the process
    pal.emit_log_message = ctypes.cast(print_errors, ctypes.c_void_p).value
    # the runtime may log while the interpreter shuts down, when a Python filter can no longer run
    atexit.register(setattr, pal, "emit_log_message", runtime_printer)
    return True
