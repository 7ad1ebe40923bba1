"""Building dflash_runner (what `make runner` runs): cmake over runner/ against this environment's executorch
wheel, with the pinned source of the tokenizers library ExecuTorch's runners use, patched (runner/patches/)."""

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from dflash_et.errors import UserError
from dflash_et.sources import Sdist, cache_dir

SOURCES = Path(__file__).resolve().parent
BUILD = SOURCES / "build"
# pytorch-labs tokenizers (HFTokenizer, the runner's --prompt): PyPI's only sdist, the one with the C++ sources
# and their third-party/ (the wheels ship headers alone)
TOKENIZERS = Sdist("pytorch-tokenizers", "1.0.1", "19938c0efd5348fb0589610094c1c6bf6e055b20889f6250068d2b552a0b137b",
                   "the tokenizers library's source")
PATCH = SOURCES / "patches" / f"pytorch-tokenizers-{TOKENIZERS.version}.patch"  # use_regex, string merges, NFC, PCRE2 alone


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


def build_runner(build_dir: Path = BUILD, targets: tuple[str, ...] = ()) -> Path:
    """Build (or bring up to date) dflash_runner, or only `targets` (dflash_host: the host library the Python engine
    calls), in `build_dir`; the runner's path. Needs cmake >= 3.19 and a C++17 compiler; the ExecuTorch headers and
    libraries come from the installed executorch wheel, the tokenizer's source from `tokenizers_source` (CMake's
    DFLASH_TOKENIZERS_SOURCE, for a build by hand). One build at a time per build directory (a file lock): test
    workers and commands build on first use."""
    if not (SOURCES / "CMakeLists.txt").is_file():
        raise UserError(f"the runner's sources are not in {SOURCES}; build it from a clone of dflash-et")
    if shutil.which("cmake") is None:
        raise UserError("cmake is not installed; the C++ runner needs cmake >= 3.19 and a C++17 compiler "
                        "(Debian: apt install cmake g++)")
    tokenizers = f"-DDFLASH_TOKENIZERS_SOURCE={tokenizers_source()}"
    build_dir.mkdir(parents=True, exist_ok=True)
    with (build_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        commands = [["cmake", "--build", str(build_dir), *(f"--target={t}" for t in targets)]]  # reconfigures by
        # itself when CMakeLists.txt changes
        cache = build_dir / "CMakeCache.txt"
        if not cache.exists():
            import executorch

            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            commands.insert(0, ["cmake", "-S", str(SOURCES), "-B", str(build_dir), *generator,
                                f"-DCMAKE_PREFIX_PATH={list(executorch.__path__)[0]}", tokenizers])
        elif tokenizers.removeprefix("-D").replace("=", ":PATH=", 1) not in cache.read_text():  # configured before it
            commands.insert(0, ["cmake", "-S", str(SOURCES), "-B", str(build_dir), tokenizers])
        log = build_dir / "build.log"
        with log.open("w") as out:
            for command in commands:
                if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
                    raise UserError(f"building the C++ runner failed (`{' '.join(command[:2])}`); its output is in "
                                    f"{log}")
    return build_dir / "dflash_runner"


if __name__ == "__main__":  # `make runner`; `python -m runner.toolchain dflash_host` builds that target alone
    try:
        print(build_runner(targets=tuple(sys.argv[1:])))
    except UserError as e:
        sys.exit(f"error: {e}")
