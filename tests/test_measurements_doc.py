"""docs/measurements.md's committed-run tables are what tools/measurements.py makes of the committed reports."""

import json
import shutil
import subprocess
from datetime import datetime, timezone

import pytest

from tools import measurements


def test_the_committed_doc_is_what_the_committed_reports_give():
    """In a clean checkout (CI's): the doc describes the committed run. After a local `dvc repro` or `dvc exp run`
    the doc describes the committed run still, which the reports on disk no longer are."""
    changed = subprocess.run(["git", "status", "--porcelain", "--", "reports"], cwd=measurements.REPO,
                             capture_output=True, text=True).stdout
    if changed:
        pytest.skip(f"reports/ differs from HEAD (a local run): {changed.split()[1]} ...")
    measurements.main(["--check"])  # exits with a message when the doc is behind the reports


def test_check_fails_when_the_doc_is_behind_the_reports(tmp_path, monkeypatch):
    doc = tmp_path / "measurements.md"
    text = measurements.DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `heldout_tau` | "))  # the committed value
    doc.write_text(text.replace(row, "| `heldout_tau` | 0.01 |"))
    monkeypatch.setattr(measurements, "DOC", doc)
    with pytest.raises(SystemExit, match="tables differ from the reports; run python -m tools.measurements and"):
        measurements.main(["--check"])


def test_an_edited_report_changes_its_table_and_is_dated_today(tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(measurements.REPORTS, reports, ignore=shutil.ignore_patterns("*.csv", "*.tsv"))
    report = json.loads((reports / "bench.json").read_text())
    report["speedup_auto"] = 9.87
    (reports / "bench.json").write_text(json.dumps(report))
    committed, edited = measurements.section(), measurements.section(reports)
    assert "9.87" not in committed
    assert "| `speedup_auto` | 9.87 |" in edited
    today = datetime.now(timezone.utc).date().isoformat()
    assert f"`reports/bench.json`, from `dvc repro bench`, {today}" in edited
    date = subprocess.run(["git", "log", "-1", "--format=%as", "--", "reports/bench.json"], cwd=measurements.REPO,
                          capture_output=True, text=True).stdout.strip()
    assert f"`reports/bench.json`, from `dvc repro bench`, {date}" in committed


def test_a_missing_report_names_its_file_and_the_stage_that_writes_it(tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(measurements.REPORTS, reports, ignore=shutil.ignore_patterns("validate.json", "*.csv", "*.tsv"))
    with pytest.raises(SystemExit) as exit:
        measurements.section(reports)
    message = str(exit.value.code)
    assert message == ("reports/validate.json is missing: `dvc repro validate` writes it "
                       "(`git checkout -- reports/validate.json` restores the committed one)")


def test_a_doc_without_the_markers_or_a_bad_flag_is_refused_in_one_line(tmp_path, monkeypatch):
    doc = tmp_path / "measurements.md"
    doc.write_text("# Measurements\n\nno generated region here\n")
    monkeypatch.setattr(measurements, "DOC", doc)
    with pytest.raises(SystemExit, match=f"^{doc} has no region from <!-- begin generated"):
        measurements.main([])
    assert doc.read_text() == "# Measurements\n\nno generated region here\n"  # nothing written
    monkeypatch.setattr(measurements, "DOC", measurements.REPO / "docs" / "measurements.md")
    with pytest.raises(SystemExit, match=r"^usage: python -m tools.measurements \[--check\]$"):
        measurements.main(["--chek"])
