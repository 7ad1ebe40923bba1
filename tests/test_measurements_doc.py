"""docs/measurements.md's committed-run tables are what tools/measurements.py makes of the committed reports."""

import json
import shutil

import pytest

from tools import measurements


def test_the_committed_doc_is_what_the_committed_reports_give():
    measurements.main(["--check"])  # exits with a message when the doc is behind the reports


def test_check_fails_when_the_doc_is_behind_the_reports(tmp_path, monkeypatch):
    doc = tmp_path / "measurements.md"
    doc.write_text(measurements.DOC.read_text().replace("| `heldout_tau` | 9.07 |", "| `heldout_tau` | 9.08 |"))
    monkeypatch.setattr(measurements, "DOC", doc)
    with pytest.raises(SystemExit, match="tables differ from the reports; commit new reports, then run"):
        measurements.main(["--check"])


def test_an_edited_report_changes_its_table_and_is_captioned_uncommitted(tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(measurements.REPORTS, reports, ignore=shutil.ignore_patterns("*.csv", "*.tsv"))
    report = json.loads((reports / "bench.json").read_text())
    report["speedup_auto"] = 9.87
    (reports / "bench.json").write_text(json.dumps(report))
    committed, edited = measurements.section(), measurements.section(reports)
    assert "9.87" not in committed
    assert "| `speedup_auto` | 9.87 |" in edited
    assert "`reports/bench.json`, from `dvc repro bench`, uncommitted" not in committed
    assert "`reports/bench.json`, from `dvc repro bench`, uncommitted" in edited


def test_a_missing_report_names_its_file_and_the_stage_that_writes_it(tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(measurements.REPORTS, reports, ignore=shutil.ignore_patterns("validate.json", "*.csv", "*.tsv"))
    with pytest.raises(SystemExit) as exit:
        measurements.section(reports)
    message = str(exit.value.code)
    assert message == ("reports/validate.json is missing: `dvc repro validate` writes it "
                       "(`git checkout -- reports/validate.json` restores the committed one)")
