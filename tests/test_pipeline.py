"""The DVC pipeline as a user drives it: repro on a local Llama-layout target with a draft trained for it,
a no-op repro, a forced export that rewrites the same bytes, a block_size and temperature experiment
compared with main,
push, and in a fresh clone pull, generate and `dvc artifacts get`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import REPO
from tests.tiny_checkpoints import chat_checkpoint

SMALL = {"model": {"draft": "train"},  # block_size: auto (the default)  # the target: a local Llama-layout checkpoint (no mask token)
         "train_draft": {"steps": 30, "num_prompts": 12, "heldout": 2, "max_new_tokens": 16, "block_size": 4,
                         "anchors": 4, "num_layers": 1},
         "export": {"max_seq_len": 128, "prefill_chunk": 16, "stock_forward": False},  # forward: test_metadata
         "validate": {"prompts": 2, "max_new_tokens": 12, "sampling": {"samples": 200, "prompts": 1}},
         "bench": {"num_prompts": 3, "long_prompts": 1, "max_new_tokens": 12, "latency_repeats": 1, "repeats": 1}}
pytestmark = pytest.mark.slow  # runs the pipeline: it lowers programs
ALL_STAGES = {"fetch_target", "fetch_draft", "export_target", "export_draft", "export_single", "package", "validate", "bench",
              "peer_bench"}


def sh(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(cwd.parent / "dvc-site"),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of this repository (what git would clone) with smaller params, targeting a local checkpoint."""
    base = tmp_path_factory.mktemp("pipeline")
    root = base / "project"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file() and not f.startswith(("artifacts/", "reports/")):
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, root / f)
    params = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in SMALL.items():
        params[section] = {**params[section], **values} if isinstance(values, dict) else values
    params["model"]["target"] = str(chat_checkpoint(base / "llama-target", "llama"))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.lock").unlink(missing_ok=True)
    sh(root, "git", "init", "-q", "-b", "main")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "init")
    return root


def ran(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}


def test_repro_then_nothing_to_do(project):
    out = sh(project, "dvc", "repro")
    assert ran(out) == ALL_STAGES
    assert "No temp allocator" not in out  # eager work runs the dense attention path: no per-call kernel logs
    for f in ("artifacts/programs/target.pte", "artifacts/programs/draft.pte", "artifacts/programs/tokenizer.json",
              "reports/export_target.json", "reports/export_draft.json",
              "reports/validate.json", "reports/bench.json", "reports/cost_curve.json", "reports/plots/acceptance.csv",
              "reports/plots/speedup_by_block.csv", "reports/plots/cost_curve.csv", "reports/plots/tokens_per_s.csv"):
        assert (project / f).is_file(), f
    bench = json.loads((project / "reports/bench.json").read_text())
    assert bench["block_size"] == "auto" and bench["lossless"] and bench["tau_auto"] >= 1
    peers = json.loads((project / "reports/peers.json").read_text())  # opt-in: off, it builds nothing
    assert peers["skipped"].startswith("peer_bench is false") and not any((project / "artifacts/gguf").iterdir())
    assert set(bench["speedup_by_block"]) == {"2", "4"} and bench["block_sizes_skipped"] == [8, 16]
    plots = json.loads(sh(project, "dvc", "plots", "show", "--json"))["data"]  # dvc.yaml's plot definitions resolve
    assert {"cost_curve", "reports/plots/speedup_by_block.csv"} <= set(plots), list(plots)
    report = json.loads((project / "reports/validate.json").read_text())
    assert report["lossless"] and report["failures"] == []
    assert report["transformers"]["logits_rel_err"] < 1e-3 and report["transformers"]["greedy_divergence"] is None
    trained = json.loads((project / "reports/train_draft/metrics.json").read_text())  # DVCLive's summary, in git
    assert trained["steps"] == 30 and trained["heldout_tau"] >= 1.0
    categories = set(json.loads((project / "reports/bench.json").read_text())["tau_by_category"])
    assert categories - {"long"} <= {"math", "code", "chat", "summarize", "rewrite", "multi-turn"}  # prompts: auto -> assistant
    assert "long" in categories  # bench.long_prompts: 1, a document then a question
    assert report["sampling"]["same_distribution"] and report["sampling"]["tests"] == 12  # 2 modes x tokens 1..6
    draft = json.loads((project / "artifacts/weights/draft/config.json").read_text())
    target = json.loads((project / "artifacts/weights/target/config.json").read_text())
    assert draft["dflash_config"]["mask_token_id"] < target["vocab_size"]  # a reserved token: the tokenizer has no mask
    assert "Data and pipelines are up to date." in sh(project, "dvc", "repro")
    status = sh(project, "git", "status", "--porcelain")
    assert "artifacts" not in status  # DVC outputs are ignored; the metrics in reports/ go to git
    sh(project, "git", "add", "dvc.lock", "reports")
    sh(project, "git", "commit", "-qm", "repro")


def test_forced_export_that_writes_the_same_bytes_reruns_nothing_downstream(project):
    """The program and export.json come out byte-identical; only the export's own memory metric (a
    measurement no stage reads) may change in dvc.lock."""
    def lock_without_memory_metric() -> dict:
        lock = yaml.safe_load((project / "dvc.lock").read_text())
        outs = lock["stages"]["export_target"]["outs"]
        lock["stages"]["export_target"]["outs"] = [o for o in outs if o["path"] != "reports/export_target.json"]
        return lock

    before = lock_without_memory_metric()
    out = sh(project, "dvc", "repro", "-f", "-s", "export_target")
    assert ran(out) == {"export_target"}
    assert "Data and pipelines are up to date." in sh(project, "dvc", "status")
    assert lock_without_memory_metric() == before
    sh(project, "git", "checkout", "-q", "--", "dvc.lock", "reports")  # the committed measurement back


def test_bench_experiment_reruns_only_bench_and_compares_with_main(project):
    out = sh(project, "dvc", "exp", "run", "-S", "block_size=2", "-S", "bench.temperature=0.7")
    assert ran(out) == {"bench", "peer_bench"}  # peer_bench follows bench's settings; off, it only says so
    bench = json.loads((project / "reports/bench.json").read_text())
    assert bench["block_size"] == 2 and bench["sampling"]["temperature"] == 0.7 and "lossless" not in bench
    table = sh(project, "dvc", "exp", "show", "--md", "--only-changed")
    main_row = next(line for line in table.splitlines() if "main" in line or "workspace" in line)
    assert "!" not in main_row.replace("!=", ""), table  # main's metrics are in git, not missing
    diff = sh(project, "dvc", "metrics", "diff", "--md")  # main (HEAD) against the experiment
    assert "| block_size " in diff and "speedup" in diff
    sh(project, "git", "checkout", "-q", "--", ".")
    sh(project, "dvc", "checkout", "-q")


def test_push_then_pull_in_a_fresh_clone_generates(project, tmp_path):
    sh(project, "dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh(project, "dvc", "push")
    sh(project, "git", "commit", "-qam", "remote")
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(project), str(clone))
    sh(clone, "dvc", "pull", "--allow-missing")
    assert (clone / "artifacts/programs/target.pte").read_bytes() == (project / "artifacts/programs/target.pte").read_bytes()
    assert not (clone / "artifacts/weights/target").exists(), "weights are push: false"
    assert ran(sh(clone, "dvc", "repro", "--allow-missing")) == set()
    out = sh(clone, "dflash", "generate", "--prompt", "Any advice on baking bread?", "--max-new-tokens", "8", "--json")
    reply = json.loads(next(line for line in out.splitlines() if line.startswith('{"tokens"')))
    assert len(reply["tokens"]) == 8 and reply["text"]
    sh(project, "git", "tag", "-a", "programs@v0.1.0", "-m", "programs v0.1.0")  # a version, as GTO registers it
    got = tmp_path / "got"
    sh(tmp_path, "dvc", "artifacts", "get", str(project), "programs", "-o", str(got))
    assert (got / "draft.pte").read_bytes() == (project / "artifacts/programs/draft.pte").read_bytes()
