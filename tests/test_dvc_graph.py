"""The DVC graph is complete: every stage depends on all the project code its command imports; and dvc.lock (with
the reports it records) is of the code in the tree."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests import REPO

PACKAGES = ("dflash_et", "stages")


def module_file(name: str) -> Path | None:
    path = REPO / name.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path) -> set[str]:
    """Project modules a file imports anywhere (top level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.split(".")[0] in PACKAGES and module_file(n)}


def closure(module: str) -> set[Path]:
    """Every project file that running `module` loads, package __init__ files included."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            f = module_file(".".join(parts[:i]))
            if f and f not in seen:
                seen.add(f)
                todo += imports_of(f)
    return {f.relative_to(REPO) for f in seen}


def covered(path: Path, deps: list[str]) -> bool:
    return any(path == Path(d) or Path(d) in path.parents for d in deps)


def stage_modules() -> dict[str, tuple[str, list[str]]]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, stage in stages.items():
        module = re.search(r"python -m ([\w.]+)", stage["cmd"]).group(1)
        out[name] = (module, [d for d in stage.get("deps", [])])
    return out


def test_every_stage_depends_on_the_code_it_imports():
    missing = {name: sorted(str(f) for f in closure(module) if not covered(f, deps))
               for name, (module, deps) in stage_modules().items()}
    assert not {k: v for k, v in missing.items() if v}, f"dvc.yaml deps miss code the stage imports: {missing}"


def test_the_check_sees_lazy_imports_and_packages():
    files = closure("stages.fetch_draft")
    assert Path("dflash_et/training/train.py") in files  # the trainer the stage hands to fetch
    assert Path("dflash_et/__init__.py") in files and Path("dflash_et/threads.py") in files
    assert Path("dflash_et/models/mlx_ops.py") in files  # imported inside a function
    assert not covered(Path("dflash_et/models/draft.py"), ["dflash_et/model", "dflash_et/models/draft"])
    assert covered(Path("dflash_et/models/draft.py"), ["dflash_et/models"])


def test_a_trained_draft_follows_the_target_weights():
    """A retrained target (same shapes, new weights) must retrain `model.draft: train`: fetch_draft depends
    on the whole target directory, not its config."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert "${paths.target}" in stages["fetch_draft"]["deps"]


def test_the_committed_reports_are_of_this_code():
    """dvc.lock (and the reports it records) must come from the code and params in the tree: a change to what a
    stage runs, without a fresh `make repro` whose dvc.lock and reports/ are committed with it, fails here.
    Artifacts (weights, programs) are not in a clone: only the files git tracks count."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    tracked = set(listed.stdout.split())
    done = subprocess.run(["dvc", "status", "--json"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    stale = {}
    for stage, changes in json.loads(done.stdout).items():
        for change in changes:
            if not isinstance(change, dict):  # "changed command", "always changed"
                stale.setdefault(stage, []).append(change)
                continue
            stale.setdefault(stage, []).extend(
                path for path, why in change.get("changed deps", {}).items()
                if why != "deleted" and any(t == path or t.startswith(path.rstrip("/") + "/") for t in tracked))
    stale = {stage: what for stage, what in stale.items() if what}
    assert not stale, (f"dvc.lock is older than what these stages run: {stale}; run `make repro` and commit dvc.lock "
                       "and reports/ (or `dvc commit STAGE` where the change cannot change what it reports)")


def native_sources(target: str) -> set[Path]:
    """The files of one of runner/CMakeLists.txt's targets: its sources and the project headers they include."""
    cmake = (REPO / "runner" / "CMakeLists.txt").read_text()
    listed = re.search(rf"add_(?:library|executable)\({target}(?: SHARED)? ([^)]*)\)", cmake).group(1).split()
    todo, seen = [REPO / "runner" / s for s in listed], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for header in re.findall(r'#include "([\w.]+)"', path.read_text()):
            todo += [d / header for d in (REPO / "runner").iterdir() if (d / header).is_file()]
    return {p.relative_to(REPO) for p in seen}


def test_the_stages_depend_on_the_native_code_they_run_and_not_on_the_server():
    """Every stage that decodes loads the host library, every stage that runs programs the runner's kernels
    (runtime/programs.py registers them), and the bench's C++ runner is dflash_runner's --ids worker
    (runner/src/protocol.h, runtime/cpp_runner.py), so the bench depends on dflash_runner's sources but the text
    worker's (runner/worker: what `dflash serve` runs) and no other stage on any of them: a change to serving leaves
    every stage up to date, and one to the command-line runner every stage but the bench (#60)."""
    stages = stage_modules()
    host, runner = native_sources("dflash_host"), native_sources("dflash_runner")
    kernels = native_sources("dflash_llama_ops")
    server = {f for f in runner if f.parts[:2] == ("runner", "worker")}
    assert Path("runner/host/planner.h") in host and Path("runner/src/protocol.cpp") in runner
    assert Path("runner/kernels/llama_ops.h") in kernels & runner
    assert server == {Path("runner/worker/worker.cpp"), Path("runner/worker/worker.h")}
    for name, (module, deps) in stages.items():
        if Path("dflash_et/runtime/native.py") in closure(module):
            assert all(covered(f, deps) for f in host), f"{name} misses host library sources"
        if Path("dflash_et/runtime/programs.py") in closure(module):
            assert all(covered(f, deps) for f in kernels), f"{name} misses the kernels' sources"
        assert not any(covered(f, deps) for f in server), f"{name} depends on the server's worker"
        if name != "bench":
            assert not any(covered(f, deps) for f in runner - host - kernels), \
                f"{name} depends on dflash_runner's own sources"
    assert all(covered(f, stages["bench"][1]) for f in runner - server)
