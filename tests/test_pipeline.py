"""The DVC pipeline as a user drives it: repro, no-op repro, a block_size experiment, push and pull."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

SMALL = {"model": {"target": "builtin-random", "draft": "builtin"},  # the default trains for minutes
         "export": {"max_seq_len": 128, "prefill_chunk": 16}, "validate": {"prompts": 2, "max_new_tokens": 12},
         "bench": {"num_prompts": 3, "max_new_tokens": 12, "latency_repeats": 1}}


def sh(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(cwd.parent / "dvc-site"),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of this repository (what git would clone), with smaller params so the pipeline runs quickly."""
    root = tmp_path_factory.mktemp("pipeline") / "project"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file() and not f.startswith("artifacts/"):
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, root / f)
    params = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in SMALL.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.lock").unlink(missing_ok=True)
    sh(root, "git", "init", "-q")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "init")
    return root


def ran(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}


def test_repro_then_nothing_to_do(project):
    out = sh(project, "dvc", "repro")
    assert ran(out) == {"fetch_target", "fetch_draft", "export_target", "export_draft", "package", "validate", "bench"}
    for f in ("programs/target.pte", "programs/draft.pte", "reports/validate.json", "reports/bench.json",
              "reports/plots/acceptance.csv", "reports/plots/target_latency.csv", "reports/plots/tokens_per_s.csv"):
        assert (project / "artifacts" / f).is_file(), f
    assert "Data and pipelines are up to date." in sh(project, "dvc", "repro")
    assert "artifacts" not in sh(project, "git", "status", "--porcelain").replace("dvc.lock", "")
    sh(project, "git", "add", "dvc.lock")
    sh(project, "git", "commit", "-qm", "repro")


def test_push_then_pull_in_a_fresh_clone(project, tmp_path):
    sh(project, "dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh(project, "dvc", "push")
    sh(project, "git", "commit", "-qam", "remote")
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(project), str(clone))
    sh(clone, "dvc", "pull", "--allow-missing")
    assert (clone / "artifacts/programs/target.pte").read_bytes() == (project / "artifacts/programs/target.pte").read_bytes()
    assert (clone / "artifacts/reports/bench.json").is_file()
    assert not (clone / "artifacts/weights/target").exists(), "weights are push: false"
    out = sh(clone, "dvc", "repro", "--allow-missing")
    assert ran(out) == set(), out


def test_block_size_experiment_reruns_only_bench(project):
    out = sh(project, "dvc", "exp", "run", "-S", "block_size=8")
    assert ran(out) == {"bench"}
    assert '"block_size": 8' in (project / "artifacts/reports/bench.json").read_text()
    table = sh(project, "dvc", "exp", "show", "--md")
    assert "block_size" in table and "tau" in table


def test_a_changed_target_refetches_or_retrains_the_draft():
    """A trained draft (model.draft: train) belongs to the target's weights, not only its config:
    retraining the target with the same shape must retrain the draft too."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert "artifacts/weights/target" in stages["fetch_draft"]["deps"]
    assert {"dflash_et/train.py", "dflash_et/corpus.py", "dflash_et/prompts.py"} <= set(stages["fetch_draft"]["deps"])
