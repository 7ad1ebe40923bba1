"""runtime/native.py's ctypes declarations are those of the host library's C API (runner/host/host_api.cpp), symbol
by symbol: a function added, removed or retyped on one side and not the other fails here, not in a caller."""

import ctypes
import re

from dflash_et.runtime import native
from tests import REPO

SCALARS = {"int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "double": ctypes.c_double,
           "size_t": ctypes.c_size_t, "int": ctypes.c_int, "void": None}


def c_api() -> dict[str, tuple[str, list[str]]]:
    """name: (return type, parameter types) of every function host_api.cpp defines inside `extern "C"`."""
    source = (REPO / "runner" / "host" / "host_api.cpp").read_text()
    block = source[source.index('extern "C" {'):]
    out = {}
    for ret, name, params in re.findall(r"^([\w ]+?\**)\s*(dflash_\w+)\(([^)]*)\)\s*\{", block, re.M):
        types = [re.sub(r"\s*\b\w+$", "", p.strip()) for p in params.split(",") if p.strip()]
        out[name] = (ret.strip(), types)
    return out


def matches(c_type: str, declared) -> bool:
    """Whether a ctypes type is that C type: a scalar as itself; a `char*` as c_char_p; any other pointer as c_void_p
    or a pointer to its scalar."""
    base = c_type.replace("const ", "").replace(" ", "")
    if not base.endswith("*"):
        return SCALARS[base] is declared
    if base == "char*":
        return declared is ctypes.c_char_p
    return declared is ctypes.c_void_p or declared == ctypes.POINTER(SCALARS.get(base[:-1]) or ctypes.c_void_p)


def test_every_function_of_the_c_api_is_declared_with_its_types():
    api = c_api()
    assert len(api) >= 20 and "dflash_lookup" in api
    assert set(api) == set(native.SIGNATURES)
    wrong = {}
    for name, (ret, params) in api.items():
        restype, argtypes = native.SIGNATURES[name]
        if not matches(ret, restype) or len(params) != len(argtypes) or not all(map(matches, params, argtypes)):
            wrong[name] = (ret, params)
    assert not wrong, f"native.SIGNATURES disagrees with host_api.cpp on {wrong}"


def test_the_check_sees_a_wrong_type():
    assert matches("const int64_t*", ctypes.POINTER(ctypes.c_int64)) and matches("float*", ctypes.c_void_p)
    assert not matches("int64_t", ctypes.c_double) and not matches("const char*", ctypes.c_void_p)
    assert not matches("int64_t*", ctypes.POINTER(ctypes.c_double))
