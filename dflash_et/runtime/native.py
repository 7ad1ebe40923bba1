"""The host library (libdflash_host.so, runner/host/host_api.cpp): the cost curve and its measurement, auto's
planners (a draft's and lookup's), a DFlash2 draft's lattice walk and lookup proposals, as the C++ runner runs them,
called here by the Python engine; and the runner's kernels (libdflash_llama_ops.so, runner/kernels/), which the
programs this process loads run in place of ExecuTorch's own (`use_runner_kernels`).

Each of those rules and kernels is written once, in runner/, so both runners make the same choices on the same
rounds and compute the same rows. The alternative, a Python twin for machines without a compiler, doubled every rule
and constant and needed a lockstep test on private fields to keep them equal; the project's users build the C++
runner anyway (it is how the programs ship). The libraries are built on first use in a process from the clone this
package was installed from (`python -m runner.toolchain dflash_host dflash_llama_ops`: a no-op once built, seconds
after a change; the first build fetches the runner's tokenizer source too, as `make runner` does).
"""

import ctypes
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from dflash_et.errors import UserError

PACKAGE_CLONE = Path(__file__).resolve().parents[2]  # the clone this package is installed from (editable)
BUILD = Path("runner") / "build"  # where `make runner` leaves the runner and its libraries, in a clone
LIBRARY = "libdflash_host.so"
KERNELS = "libdflash_llama_ops.so"  # built with it, beside it

_i64, _f64, _ptr, _size, _text = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
_ERROR = [_text, _size]  # (error, error_size): where a call that fails writes why
SIGNATURES = {  # name: (restype, argtypes), as host_api.cpp declares them
    "dflash_curve_load": (_ptr, [_text, _text, *_ERROR]),
    "dflash_curve_parse": (_ptr, [_text, _text, *_ERROR]),
    "dflash_curve_json": (_size, [_ptr, _text, _size]),
    "dflash_curve_target": (_f64, [_ptr, _i64, _i64]),
    "dflash_curve_draft": (_f64, [_ptr, _i64, _i64]),
    "dflash_curve_free": (None, [_ptr]),
    "dflash_programs_identity": (_size, [ctypes.POINTER(_i64), _i64, _text, _size]),
    "dflash_planned": (ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
    "dflash_planner_new": (_ptr, [_ptr, _i64, _f64]),
    "dflash_planner_block": (_i64, [_ptr, _i64, _i64]),
    "dflash_planner_verify_count": (_i64, [_ptr, _ptr, _i64, _i64, _i64]),
    "dflash_planner_observe": (None, [_ptr, _i64, _i64, _f64]),
    "dflash_planner_learned": (None, [_ptr, ctypes.POINTER(_f64)]),
    "dflash_planner_free": (None, [_ptr]),
    "dflash_sweep_new": (_ptr, [_i64, _i64, _i64]),
    "dflash_sweep_starts": (_i64, [_ptr, ctypes.POINTER(_i64), _i64]),
    "dflash_sweep_tokens": (_i64, [_ptr]),
    "dflash_sweep_count": (_i64, [_ptr]),
    "dflash_sweep_planner": (_ptr, [_ptr, _i64]),
    "dflash_sweep_record": (None, [_ptr, _i64, _i64, _ptr, _i64, ctypes.POINTER(_f64), ctypes.POINTER(_f64)]),
    "dflash_sweep_curve": (_ptr, [_ptr, _text]),
    "dflash_sweep_free": (None, [_ptr]),
    "dflash_lookup": (_i64, [ctypes.POINTER(_i64), _i64, _i64, ctypes.POINTER(_i64), ctypes.POINTER(_i64)]),
    "dflash_lookup_planner_new": (_ptr, [_ptr, _i64]),
    "dflash_lookup_planner_verify_count": (_i64, [_ptr, _i64, _i64, _i64]),
    "dflash_lookup_planner_observe": (None, [_ptr, _i64, _i64]),
    "dflash_lookup_planner_free": (None, [_ptr]),
    "dflash_lookup_round": (_i64, [_ptr, _ptr, _i64, _i64, _i64]),
    "dflash_planner_taken": (None, [_ptr, _i64]),
    "dflash_walk": (None, [_ptr, _ptr, _ptr, _i64, _i64, _i64, _f64, ctypes.c_int, ctypes.c_uint64, _ptr, _ptr, _ptr]),
}


def find_library() -> Path:
    """libdflash_host.so (libdflash_llama_ops.so beside it): $DFLASH_HOST_LIBRARY; else built (or brought up to
    date) in the clone this package was installed from, or the one built there when this machine has no cmake to
    check it with; else one beside a dflash_runner on PATH (an installed runner)."""
    if os.environ.get("DFLASH_HOST_LIBRARY"):
        return Path(os.environ["DFLASH_HOST_LIBRARY"])
    built = PACKAGE_CLONE / BUILD / LIBRARY
    if (PACKAGE_CLONE / "runner" / "CMakeLists.txt").is_file() and shutil.which("cmake"):
        done = subprocess.run([sys.executable, "-m", "runner.toolchain", "dflash_host", "dflash_llama_ops"],
                              cwd=PACKAGE_CLONE, capture_output=True, text=True)
        if done.returncode:
            raise UserError((done.stderr.strip().splitlines() or ["building it failed"])[-1].removeprefix("error: "))
        return built
    installed = shutil.which("dflash_runner")
    for library in (built, installed and Path(installed).parent / LIBRARY):
        if library and library.is_file():
            return library
    raise UserError(f"running programs needs the runner's host library ({LIBRARY}) and kernels ({KERNELS}), and "
                    "they cannot be built here (no cmake, or no runner/ sources); run `make runner` in a clone of "
                    "dflash-et, or set DFLASH_HOST_LIBRARY to a built one")


@functools.cache
def _found() -> Path:
    """find_library's answer, once per process (it runs the build): the host library and the kernels share it."""
    return find_library()


@functools.cache
def library() -> ctypes.CDLL:
    """The host library, loaded once per process with its functions' signatures."""
    lib = ctypes.CDLL(str(_found()))
    for name, (restype, argtypes) in SIGNATURES.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


@functools.cache
def use_runner_kernels() -> None:
    """Registers the C++ runner's kernels of llama::custom_sdpa and llama::gated_delta_rule (libdflash_llama_ops.so)
    under kernel keys, which the programs loaded from then on prefer to ExecuTorch's own (the executorch wheel's,
    registered without one): both runners then run one kernel, whose rows do not depend on how many a call has, so
    that a verify's rows are bit for bit one-token decoding's, which greedy decoding's exactness at 8-bit activations
    needs (runner/kernels/llama_ops.h)."""
    ctypes.CDLL(str(kernels_beside(_found()))).dflash_register_llama_ops_keyed()


def kernels_beside(host: Path) -> Path:
    """The kernels library built with the host library `host` (beside it), or the one-line error that says so."""
    kernels = host.parent / KERNELS
    if not kernels.is_file():
        raise UserError(f"{kernels} is missing beside {host.name}; run `make runner` where it was built")
    return kernels


def _text_of(call, *args) -> str:
    """A string a library call writes: it returns the size it needs, so a second call gets a buffer that fits."""
    out = ctypes.create_string_buffer(256)
    needed = call(*args, out, len(out))
    if needed > len(out):
        out = ctypes.create_string_buffer(needed)
        call(*args, out, len(out))
    return out.value.decode()


def _or_error(call, *args) -> int:
    """A handle from a call that may fail; UserError with the library's one-line reason otherwise."""
    error = ctypes.create_string_buffer(1024)
    handle = call(*args, error, len(error))
    if not handle:
        raise UserError(error.value.decode())
    return handle


class Curve:
    """A cost curve held by the library (dflash::CostCurve): read, checked, interpolated and written there."""

    def __init__(self, handle: int):
        self._lib, self._handle = library(), handle

    @classmethod
    def load(cls, path: Path, programs: str) -> "Curve":
        """The curve in `path`, checked to be of `programs`."""
        return cls(_or_error(library().dflash_curve_load, str(path).encode(), programs.encode()))

    @classmethod
    def parse(cls, text: str, source: str) -> "Curve":
        return cls(_or_error(library().dflash_curve_parse, text.encode(), source.encode()))

    def json(self) -> str:
        return _text_of(self._lib.dflash_curve_json, self._handle)

    def target(self, tokens: int, pos: int) -> float:
        return self._lib.dflash_curve_target(self._handle, tokens, pos)

    def draft(self, block: int, pos: int) -> float:
        return self._lib.dflash_curve_draft(self._handle, block, pos)

    def __del__(self) -> None:
        self._lib.dflash_curve_free(self._handle)


def programs_identity(parts: list[int]) -> str:
    """Which programs a cost curve was measured on, from their checkpoint ids, limits and file sizes."""
    return _text_of(library().dflash_programs_identity, (_i64 * len(parts))(*parts), len(parts))


def planned(auto: bool, greedy: bool) -> bool:
    """Whether a generation is planned round by round (runner/host/planner.h says why sampled auto is not)."""
    return bool(library().dflash_planned(auto, greedy))


class Planner:
    """A planner of the library behind generate.py's RoundPlanner hooks: auto's (`adaptive_planner`) or a cost
    sweep's."""

    def __init__(self, handle: int):
        self._lib, self._handle = library(), handle

    def block(self, pos: int, room: int) -> int:
        return self._lib.dflash_planner_block(self._handle, pos, room)

    def verify_count(self, draft_logits: torch.Tensor, pos: int) -> int:
        logits = draft_logits.detach().float().contiguous()
        return self._lib.dflash_planner_verify_count(self._handle, logits.data_ptr(), *logits.shape, pos)

    def observe(self, verified: int, accepted: int, seconds: float | None = None) -> None:
        """What the target made of the round; `seconds` its wall time (default: the time since `block`)."""
        self._lib.dflash_planner_observe(self._handle, verified, accepted, -1.0 if seconds is None else seconds)

    def taken(self, accepted: int) -> None:
        """auto's: the round it planned went to lookup proposals, of which the target accepted `accepted`."""
        self._lib.dflash_planner_taken(self._handle, accepted)

    def learned(self) -> tuple[float, float]:
        """auto's (saving, per_call): ms that choosing k saves lately, and what a call costs beyond the curve."""
        out = (_f64 * 2)()
        self._lib.dflash_planner_learned(self._handle, out)
        return out[0], out[1]

    def __del__(self) -> None:
        self._lib.dflash_planner_free(self._handle)


def adaptive_planner(curve: Curve, max_block: int, time_weight: float | None = None) -> Planner:
    """auto's planner (runner/host/planner.h) over `curve`, for drafts of at most `max_block` tokens; `time_weight`:
    how fast it follows the rounds' wall times (0: the curve alone, so that its choices are the rounds' alone;
    default: the planner's)."""
    return Planner(library().dflash_planner_new(curve._handle, max_block, -1.0 if time_weight is None else time_weight))


class CostSweep:
    """How a cost curve is measured (dflash::CostSweep, runner/host/cost_curve.h): the caller decodes
    `tokens` new tokens after each of `starts`, `count` times each, with `planner(n)`, and `record`s the rounds."""

    def __init__(self, max_block: int, max_seq_len: int, repeats: int):
        self._lib = library()
        self._handle = self._lib.dflash_sweep_new(max_block, max_seq_len, repeats)
        starts = (_i64 * self._lib.dflash_sweep_starts(self._handle, None, 0))()  # how many, then which
        self._lib.dflash_sweep_starts(self._handle, starts, len(starts))
        self.starts = list(starts)
        self.tokens, self.count = self._lib.dflash_sweep_tokens(self._handle), self._lib.dflash_sweep_count(self._handle)

    def planner(self, n: int) -> Planner:
        return Planner(self._lib.dflash_sweep_planner(self._handle, n))

    def record(self, start: int, n: int, planner: Planner, verify_s: list[float], draft_s: list[float]) -> None:
        rounds = len(verify_s)
        self._lib.dflash_sweep_record(self._handle, start, n, planner._handle, rounds, (_f64 * rounds)(*verify_s),
                                      (_f64 * rounds)(*draft_s))

    def curve(self, programs: str) -> Curve:
        return Curve(self._lib.dflash_sweep_curve(self._handle, programs.encode()))

    def __del__(self) -> None:
        self._lib.dflash_sweep_free(self._handle)


def walk(candidates: torch.Tensor, unary: torch.Tensor, pair: torch.Tensor, vocab_size: int,
         temperature: float = 0.0, sample: bool = False, seed: int = 0
         ) -> tuple[list[int], torch.Tensor | None, torch.Tensor]:
    """A DFlash2 lattice's path as the runner's sampler walks it (runner/host/sampling.h, Sampler::walk): (path,
    q [P, V] for sampled proposals (temperature > 0 and `sample`) else None, the scores [P, k] each choice was
    made from)."""
    candidates, unary, pair = candidates.long().contiguous(), unary.float().contiguous(), pair.float().contiguous()
    positions, k = candidates.shape
    path, scores = torch.zeros(positions, dtype=torch.long), torch.zeros(positions, k)
    sampled = temperature > 0 and sample
    q = torch.zeros(positions, vocab_size) if sampled else torch.zeros(0)
    library().dflash_walk(candidates.data_ptr(), unary.data_ptr(), pair.data_ptr(), positions, k, vocab_size,
                          temperature, int(sample), seed, path.data_ptr(), scores.data_ptr(), q.data_ptr())
    return path.tolist(), q if sampled else None, scores


def lookup(context: list[int], max_tokens: int) -> tuple[list[int], int]:
    """Lookup proposals after `context` (runner/host/lookup.h): (at most `max_tokens` tokens that followed the latest
    earlier occurrence of its longest recurring suffix, that suffix's length); ([], 0) where none recurs."""
    return History(context).lookup(max_tokens)


class History:
    """A generation's tokens (the prompt's, then those emitted), kept where lookup reads them: a round's lookup and
    its new tokens copy nothing else."""

    def __init__(self, tokens: list[int], room: int = 0):
        self._ids, self.length = (_i64 * (len(tokens) + room))(*tokens), len(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Appends `tokens` (at most the `room` given, all told)."""
        self._ids[self.length:self.length + len(tokens)] = tokens
        self.length += len(tokens)

    def lookup(self, max_tokens: int) -> tuple[list[int], int]:
        """`lookup` after the tokens so far."""
        out, ngram = (_i64 * max(max_tokens, 0))(), _i64()
        n = library().dflash_lookup(self._ids, self.length, max_tokens, out, ctypes.byref(ngram))
        return list(out[:n]), ngram.value


class LookupPlanner:
    """auto's planner of lookup proposals (runner/host/lookup.h, dflash::LookupPlanner): how many of a round's
    proposals to verify, by the cost curve and how often proposals after a match of the same length were accepted."""

    def __init__(self, curve: Curve, max_block: int):
        self._lib = library()
        self._handle = self._lib.dflash_lookup_planner_new(curve._handle, max_block)

    def verify_count(self, ngram: int, proposed: int, pos: int) -> int:
        return self._lib.dflash_lookup_planner_verify_count(self._handle, ngram, proposed, pos)

    def observe(self, verified: int, accepted: int) -> None:
        self._lib.dflash_lookup_planner_observe(self._handle, verified, accepted)

    def take(self, planner: Planner, ngram: int, proposed: int, pos: int) -> int:
        """auto with a draft: how many of the lookup proposals take the round auto's `planner` planned (0: none)."""
        return self._lib.dflash_lookup_round(planner._handle, self._handle, ngram, proposed, pos)

    def __del__(self) -> None:
        self._lib.dflash_lookup_planner_free(self._handle)
