"""Programs this host cannot run: validate and bench skip them, in one line and with every declared output
written, so the pipeline goes on; programs it can run but that are broken (a missing .ptd) still fail."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from dflash_et.errors import ProgramError
from dflash_et.evaluate.bench import PLOT_COLUMNS, BenchConfig, run_bench
from dflash_et.evaluate.validate import ValidateConfig, validate
from dflash_et.runtime import programs as runtime_programs
from dflash_et.runtime.programs import missing_backend
from tests import REPO
from tests.test_export_variants import mlx_programs


def stage_argv(stage: str, paths: dict[str, Path]) -> list[str]:
    """The arguments dvc.yaml gives `stage`, with its ${paths.*} variables pointed at `paths`."""
    cmd = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]["cmd"]
    for name, path in paths.items():
        cmd = cmd.replace(f"${{paths.{name}}}", str(path))
    assert "${" not in cmd, cmd
    return cmd.split()[3:]  # after `python -m stages.<name>`


def declared_outputs(stage: str, reports: Path) -> list[Path]:
    """Every output dvc.yaml declares for `stage` (outs, metrics, plots), under `reports`."""
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    entries = [e for key in ("outs", "metrics", "plots") for e in spec.get(key, [])]
    names = [next(iter(e)) if isinstance(e, dict) else e for e in entries]
    assert names and all(n.startswith("${paths.reports}/") for n in names), names
    return [reports / n.removeprefix("${paths.reports}/") for n in names]


def test_missing_backend_reads_the_backend_from_export_json(tmp_path, monkeypatch):
    assert missing_backend(tmp_path) is None  # nothing says: loading decides
    monkeypatch.setitem(runtime_programs.RUNTIME_BACKENDS, "mlx", ("NoSuchBackend", "Apple silicon"))
    for backend in ("mlx", "xnnpack", "portable"):
        (tmp_path / "export.json").write_text(json.dumps({"config": {"backend": backend}}))
        why = missing_backend(tmp_path)
        if backend == "mlx":
            assert why == ("programs need the mlx backend (NoSuchBackend), which this host's executorch runtime "
                           "lacks; run them on Apple silicon")
        else:  # the pip wheel has XNNPACK; portable programs need no delegate
            assert why is None, backend


def test_validate_and_bench_skip_mlx_programs_on_a_host_without_mlx(trained_pair, tmp_path_factory, tmp_path,
                                                                    monkeypatch, capsys):
    programs = mlx_programs(trained_pair, tmp_path_factory, "bf16", "4w")
    why = missing_backend(programs)
    if why is None:
        pytest.skip("this host's executorch runtime has MLX: validate and bench run the programs")
    assert "mlx backend" in why and ".ptd" not in why

    report = validate(programs, *trained_pair, ValidateConfig(prompts=1, max_new_tokens=8))
    assert report == {"skipped": why, "failures": []}
    metrics, plots, curve = run_bench(programs, 8, BenchConfig(num_prompts=2, max_new_tokens=8))
    assert metrics == {"block_size": 8, "skipped": why} and curve is None
    assert plots == {name: [] for name in PLOT_COLUMNS}

    import stages.bench
    import stages.validate

    monkeypatch.chdir(REPO)  # the stages read params.yaml from the working directory, as under dvc
    paths = {"programs": programs, "target": trained_pair[0], "draft": trained_pair[1], "reports": tmp_path}
    capsys.readouterr()
    for stage, module in (("validate", stages.validate), ("bench", stages.bench)):
        module.main(stage_argv(stage, paths))  # returns: exit status 0
        assert capsys.readouterr().out == f"[{stage}] skipped: {why}\n"
        outputs = declared_outputs(stage, tmp_path)
        assert all(p.is_file() for p in outputs), [str(p) for p in outputs if not p.is_file()]
        report = json.loads(next(p for p in outputs if p.name == f"{stage}.json").read_text())
        assert report["skipped"] == why
    for name, columns in PLOT_COLUMNS.items():
        assert (tmp_path / "plots" / f"{name}.csv").read_text() == ",".join(columns) + "\n"


def test_programs_without_their_ptd_still_fail_clearly(shared_programs, trained_pair, tmp_path):
    """XNNPACK programs this host can run, whose shared.ptd is missing: an error that says so, no skip."""
    broken = tmp_path / "programs"
    shutil.copytree(shared_programs, broken, ignore=shutil.ignore_patterns("shared.ptd"))
    assert missing_backend(broken) is None
    with pytest.raises(ProgramError, match="target.pte: cannot be loaded .*needs its .ptd weights file"):
        validate(broken, *trained_pair, ValidateConfig(prompts=1, max_new_tokens=8))
    with pytest.raises(ProgramError, match="target.pte: cannot be loaded .*needs its .ptd weights file"):
        run_bench(broken, 8, BenchConfig(num_prompts=1, max_new_tokens=8))
