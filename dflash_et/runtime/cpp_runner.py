"""The C++ runner (`runner/`, `dflash_runner`) behind the engine's interface: the same decoding loop,
with no Python between the program calls.

`build_runner` configures and builds it against this environment's executorch wheel and the pinned source
of the tokenizers library ExecuTorch's runners use (what `make runner` runs); `CppEngine` keeps one
`dflash_runner --serve` process per programs directory, so that the programs load once and their caches
stay warm across generations, as in the Python engine. The runner decodes at fixed blocks or `auto`
(runner/src/planner.cpp: adaptive.py's planner, ported rule for rule, with its cost curve from the bench's
file or measured by the runner; `CppPlanner` holds the two to the same choices), greedy or sampled by the
same algorithm; its seeded generator is its own, so a seed gives other tokens than in the Python engine.
"""

import ctypes
import hashlib
import json
import math
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from dflash_et.errors import ProgramError, UserError
from dflash_et.runtime.adaptive import CostCurve
from dflash_et.runtime.generate import Generation, OnTokens, Round
from dflash_et.runtime.engine import BlockSize, check_block_size, recommended
from dflash_et.runtime.sampling import Sampler, Sampling
from dflash_et.sources import Sdist, cache_dir

RUNNERS = ("python", "cpp")  # the host loops: dflash_et.runtime (engine.py) and dflash_runner (this module)
SOURCES = Path(__file__).resolve().parents[2] / "runner"
BUILD = SOURCES / "build"
# pytorch-labs tokenizers (HFTokenizer, the runner's --prompt): PyPI's only sdist, the one with the C++ sources
# and their third-party/ (the wheels ship headers alone)
TOKENIZERS = Sdist("pytorch-tokenizers", "1.0.1", "19938c0efd5348fb0589610094c1c6bf6e055b20889f6250068d2b552a0b137b",
                   "the tokenizers library's source")


PATCH = SOURCES / "patches" / f"pytorch-tokenizers-{TOKENIZERS.version}.patch"  # use_regex, string merges, NFC, quiet RE2


def tokenizers_source(cache: Path | None = None) -> Path:
    """The tokenizers library's source tree with runner/patches/ applied, downloaded from PyPI and checked against
    the pinned hash on first use; a tree of its own per patch, so a changed patch never meets an old build."""
    root = (cache or cache_dir()) / f"pytorch-tokenizers-{TOKENIZERS.version}"
    tree = root / f"src-{hashlib.sha256(PATCH.read_bytes()).hexdigest()[:12]}"
    if not (tree / "src" / "hf_tokenizer.cpp").is_file():
        if shutil.which("patch") is None:
            raise UserError("the `patch` command is not installed; the C++ runner's tokenizer needs it "
                            "(Debian: apt install patch)")
        staged = root / ".staged"
        TOKENIZERS.extract(root, "", staged)
        with PATCH.open("rb") as diff:
            done = subprocess.run(["patch", "-p1", "--batch", "-d", str(staged)], stdin=diff, capture_output=True)
        if done.returncode:
            why = " ".join(done.stdout.decode().split())  # one line
            raise UserError(f"{PATCH} does not apply to {TOKENIZERS.filename}: {why}")
        staged.replace(tree)
    return tree


def build_runner(build_dir: Path = BUILD) -> Path:
    """Build (or bring up to date) dflash_runner in `build_dir`; its path. Needs cmake >= 3.19 and a C++17
    compiler; the ExecuTorch headers and libraries come from the installed executorch wheel, the tokenizer's
    source from `tokenizers_source` (CMake's DFLASH_TOKENIZERS_SOURCE, for a build by hand)."""
    import executorch

    if not (SOURCES / "CMakeLists.txt").is_file():
        raise UserError(f"the runner's sources are not in {SOURCES}; build it from a clone of dflash-et")
    if shutil.which("cmake") is None:
        raise UserError("cmake is not installed; the C++ runner needs cmake >= 3.19 and a C++17 compiler "
                        "(Debian: apt install cmake g++)")
    tokenizers = f"-DDFLASH_TOKENIZERS_SOURCE={tokenizers_source()}"
    build_dir.mkdir(parents=True, exist_ok=True)
    commands = [["cmake", "--build", str(build_dir)]]  # reconfigures by itself when CMakeLists.txt changes
    cache = build_dir / "CMakeCache.txt"
    if not cache.exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        commands.insert(0, ["cmake", "-S", str(SOURCES), "-B", str(build_dir), *generator,
                            f"-DCMAKE_PREFIX_PATH={list(executorch.__path__)[0]}", tokenizers])
    elif tokenizers.removeprefix("-D").replace("=", ":PATH=", 1) not in cache.read_text():  # configured before it
        commands.insert(0, ["cmake", "-S", str(SOURCES), "-B", str(build_dir), tokenizers])
    log = build_dir / "build.log"
    with log.open("w") as out:
        for command in commands:
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise UserError(f"building the C++ runner failed (`{' '.join(command[:2])}`); its output is in {log}")
    return build_dir / "dflash_runner"


class CppEngine:
    """`ar` and `dflash` of `Engine`, run by dflash_runner over the programs in `programs_dir`."""

    def __init__(self, programs_dir: Path, binary: Path = BUILD / "dflash_runner", threads: int = 0,
                 cost_curve: Path | None = None):
        """`threads`: the runtime's thread pool size (0: one per core; fewer leave cores to other processes);
        `cost_curve`: auto's, as the bench wrote it for these programs (default: the runner measures one)."""
        if not binary.is_file():
            raise UserError(f"the C++ runner is not built ({binary} is missing); run `make runner`")
        self._log = tempfile.TemporaryFile("w+")  # the runtime's log lines; read when something fails
        curve = ["--cost-curve", str(cost_curve)] if cost_curve else []
        self._process = subprocess.Popen([str(binary), "--programs", str(programs_dir), "--serve",
                                          "--threads", str(threads), *curve], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        ready = self._process.stdout.readline()
        if not ready:
            raise ProgramError(self._failure())
        self.meta = json.loads(ready)  # limits, and the recommended sampling when target.pte carries it
        self.max_context_len, self.max_block_size = self.meta["max_context_len"], self.meta["max_block_len"]
        self.load_rss_kb = self.meta["peak_rss_kb"]  # peak resident memory once both programs are loaded
        self.programs_dir = programs_dir

    def _failure(self) -> str:
        """The runner's own one-line error, from its stderr."""
        self._process.wait()
        self._log.seek(0)
        errors = [line for line in self._log.read().splitlines() if line.startswith("error: ")]
        return errors[-1].removeprefix("error: ") if errors else f"dflash_runner exited with status {self._process.returncode}"

    def _reply(self, line: str) -> dict:
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()
        reply = self._process.stdout.readline()
        if not reply:
            raise ProgramError(self._failure())
        out = json.loads(reply)
        if "error" in out:
            raise UserError(out["error"])
        return out

    def _request(self, line: str, on_tokens: OnTokens) -> Generation:
        out = self._reply(line)
        self.peak_rss_kb = out["peak_rss_kb"]
        on_tokens and on_tokens(out["tokens"])  # all at once: the runner replies when the generation is done
        return Generation(out["tokens"], out["prefill_s"], [Round(**r) for r in out["rounds"]])

    def check_block_size(self, block_size: BlockSize) -> BlockSize:
        """Checked before any decoding (the bench's blocks); `dflash` leaves the range to the runner."""
        return check_block_size(block_size, self.max_block_size, "draft.pte")

    def cost_curve(self, repeats: int = 5) -> CostCurve:
        """auto's cost curve in the runner: the one it was given, or measured there now (once)."""
        return CostCurve(**self._reply(f"cost_curve {repeats}"))

    def recommended(self, **overrides) -> Sampling:
        """The checkpoint's recommended sampling settings (target.pte's metadata), `overrides` on top."""
        return recommended(self.meta, self.programs_dir / "target.pte", **overrides)

    @staticmethod
    def _settings(sampler: Sampler | None) -> str:
        """A request's sampling settings (none: greedy)."""
        s = sampler.sampling if sampler else Sampling()
        if s.greedy:
            return ""
        return (f" temperature={s.temperature!r} top_p={s.top_p!r} top_k={s.top_k or 0} proposals={s.proposals} "
                f"seed={s.seed}")

    def ar(self, prompt: list[int], max_new_tokens: int, on_tokens: OnTokens = None,
           sampler: Sampler | None = None) -> Generation:
        """Plain decoding with target.pte alone (greedy unless a sampler says otherwise)."""
        return self._request(f"ar {max_new_tokens} {','.join(map(str, prompt))}{self._settings(sampler)}", on_tokens)

    def dflash(self, prompt: list[int], max_new_tokens: int, block_size: BlockSize | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation:
        """DFlash at a fixed block (default: the largest draft.pte takes) or `auto` (sampled: the largest block,
        as `Engine.dflash`), greedy unless a sampler says otherwise."""
        block = block_size or self.max_block_size
        return self._request(f"dflash {block} {max_new_tokens} {','.join(map(str, prompt))}{self._settings(sampler)}",
                             on_tokens)

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait()
        self._log.close()

    def __enter__(self) -> "CppEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LlamaKernels:
    """The runner's kernels of llama::update_cache, llama::custom_sdpa and llama::gated_delta_rule
    (libdflash_llama_ops.so, built beside it) on contiguous torch tensors: to check them against ExecuTorch's
    own ops and to time them."""

    DTYPES = {torch.float32: 6, torch.bfloat16: 15}  # ExecuTorch ScalarType codes

    def __init__(self, library: Path = BUILD / "libdflash_llama_ops.so"):
        self.lib = ctypes.CDLL(str(library))
        sizes, pointer = ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p
        self.lib.dflash_update_cache.argtypes = [pointer, sizes, pointer, sizes, ctypes.c_int64, ctypes.c_int]
        self.lib.dflash_custom_sdpa.argtypes = [pointer, sizes, pointer, pointer, sizes, pointer, ctypes.c_int64,
                                                ctypes.c_int, ctypes.c_double, pointer, ctypes.c_int]
        self.lib.dflash_gated_delta_rule.argtypes = [ctypes.POINTER(pointer), ctypes.POINTER(sizes),
                                                     ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]

    @staticmethod
    def _sizes(t: torch.Tensor):
        return (ctypes.c_int64 * t.dim())(*t.shape)

    def update_cache(self, value: torch.Tensor, cache: torch.Tensor, start: int) -> int:
        """Writes value [B,S,H,D] into cache [B,S_max,H,D] at start; 0, or the kernel's error code."""
        return self.lib.dflash_update_cache(value.data_ptr(), self._sizes(value), cache.data_ptr(), self._sizes(cache),
                                            start, self.DTYPES[value.dtype])

    def custom_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, causal: bool,
                    scale: float | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.full_like(q, float("nan"))
        error = self.lib.dflash_custom_sdpa(q.data_ptr(), self._sizes(q), k.data_ptr(), v.data_ptr(), self._sizes(k),
                                            None if mask is None else mask.data_ptr(), start, int(causal),
                                            math.nan if scale is None else scale, out.data_ptr(), self.DTYPES[q.dtype])
        if error:
            raise RuntimeError(f"llama::custom_sdpa failed with error {error:#x}")
        return out

    def gated_delta_rule(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor,
                         beta: torch.Tensor, initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [B,Hq,T,Dv], final_state [B,H,Dk,Dv]) of the recurrence from initial_state (left as it is)."""
        out = torch.full((*query.shape[:3], value.shape[3]), math.nan)
        final_state = torch.full(initial_state.shape, math.nan)
        tensors = (query, key, value, decay, beta, initial_state, out, final_state)
        n = len(tensors)
        error = self.lib.dflash_gated_delta_rule((ctypes.c_void_p * n)(*(t.data_ptr() for t in tensors)),
                                                 (ctypes.POINTER(ctypes.c_int64) * n)(*map(self._sizes, tensors)),
                                                 (ctypes.c_int * n)(*(t.dim() for t in tensors)),
                                                 (ctypes.c_int * n)(*(self.DTYPES[t.dtype] for t in tensors)))
        if error:
            raise RuntimeError(f"llama::gated_delta_rule failed with error {error:#x}")
        return out, final_state


class CppPlanner:
    """The runner's auto planner (libdflash_planner.so, built beside it) behind `AdaptivePlanner`'s hooks, so
    that a test can give both the same rounds and compare their choices."""

    def __init__(self, curve: Path, programs: str, max_block: int, library: Path = BUILD / "libdflash_planner.so"):
        """Over the cost curve file `curve`, checked to be of `programs` as the runner checks it."""
        self.lib = ctypes.CDLL(str(library))
        self.lib.dflash_planner_new.restype = ctypes.c_void_p
        self.lib.dflash_planner_new.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p,
                                                ctypes.c_size_t]
        self.lib.dflash_planner_block.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self.lib.dflash_planner_block.restype = ctypes.c_int64
        self.lib.dflash_planner_verify_count.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                         ctypes.c_int64, ctypes.c_int64]
        self.lib.dflash_planner_verify_count.restype = ctypes.c_int64
        self.lib.dflash_planner_observe.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_double]
        self.lib.dflash_planner_learned.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
        self.lib.dflash_planner_free.argtypes = [ctypes.c_void_p]
        error = ctypes.create_string_buffer(1024)
        self._planner = self.lib.dflash_planner_new(str(curve).encode(), programs.encode(), max_block, error,
                                                    len(error))
        if not self._planner:
            raise UserError(error.value.decode())

    def block(self, pos: int, room: int) -> int:
        return self.lib.dflash_planner_block(self._planner, pos, room)

    def verify_count(self, draft_logits: torch.Tensor, pos: int) -> int:
        logits = draft_logits.float().contiguous()
        return self.lib.dflash_planner_verify_count(self._planner, logits.data_ptr(), *logits.shape, pos)

    def observe(self, verified: int, accepted: int, seconds: float) -> None:
        self.lib.dflash_planner_observe(self._planner, verified, accepted, seconds)

    def learned(self) -> tuple[float, float]:
        """(saving, per_call): AdaptivePlanner's attributes of those names."""
        out = (ctypes.c_double * 2)()
        self.lib.dflash_planner_learned(self._planner, out)
        return out[0], out[1]

    def __del__(self) -> None:
        self.lib.dflash_planner_free(self._planner)


if __name__ == "__main__":  # `make runner`
    print(build_runner())
