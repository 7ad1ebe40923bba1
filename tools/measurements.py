"""Writes the tables of docs/measurements.md's "The committed run" from the committed reports, so the doc's figures
of the current pipeline are the pipeline's own, never typed by hand (issue #28). Each table names the report it
reads, the `dvc repro` stage that wrote it (from dvc.lock) and the report's date: the day it was committed, or
today for one not committed yet (so a doc written beside new reports and committed with them the same day stands).

    python -m tools.measurements          # rewrite the region between the doc's two markers, nothing else
    python -m tools.measurements --check  # exit 1 if that region is not what the reports give (the tests run it)

"""

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

from dflash_et.evaluate import bench  # the bench's metric names, order, docstrings and number format

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "reports"
DOC = REPO / "docs" / "measurements.md"
BEGIN, END = "<!-- begin generated: python -m tools.measurements -->", "<!-- end generated -->"


def _git(path: Path, *args: str) -> str | None:
    done = subprocess.run(["git", *args, "--", path.name], cwd=path.parent, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def dated(path: Path) -> str:
    """The day the report was committed (the author date, not the committer's: a rebase keeps it, so a rebased
    branch's doc is not stale), or today (UTC) where it differs from HEAD or git does not know it."""
    date = _git(path, "log", "-1", "--format=%as")
    if date and _git(path, "status", "--porcelain") == "":
        return date
    return datetime.now(timezone.utc).date().isoformat()


class Source:
    """One report's figures and where they come from."""

    def __init__(self, reports: Path, name: str, stages: dict[str, str]):
        self.name = f"{REPORTS.name}/{name}"  # as dvc.lock and the captions name it, wherever the copy lies
        self.stage = stages[self.name]
        path = reports / name
        if not path.exists():
            sys.exit(f"{self.name} is missing: `dvc repro {self.stage}` writes it "
                     f"(`git checkout -- {self.name}` restores the committed one)")
        self.data: dict = json.loads(path.read_text())
        self.date = dated(path)

    def caption(self) -> str:
        return f"`{self.name}`, from `dvc repro {self.stage}`, {self.date}"


def stages() -> dict[str, str]:
    """Each output dvc.lock records (every report) -> the stage that wrote it."""
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    return {out["path"]: name for name, stage in lock["stages"].items() for out in stage.get("outs", [])}


def cell(value) -> str:
    """As the bench prints it, except that small numbers (errors, p-values) keep two significant digits."""
    if isinstance(value, float) and value and abs(value) < 0.1:
        return f"{value:.2g}"
    return bench.shown(value).replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"
    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def flat(report: dict, prefix: str = "") -> dict:
    """Nested metrics under dotted names, as `dvc metrics show` names them."""
    out = {}
    for key, value in report.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def listed(report: dict) -> str:
    """Every metric of a report, one a row."""
    return table(["metric", "value"], [[f"`{k}`", cell(v)] for k, v in flat(report).items()])


def headline(r: dict) -> str:
    """What the bench stage prints (bench.HEADLINE), with what each metric is where bench.METRICS says."""
    names = [name for line in bench.HEADLINE for name in line if name in r]
    return table(["metric", "value", "what it is"],
                 [[f"`{n}`", cell(r[n]), (bench.METRICS[n].__doc__ or "").strip()] for n in names])


def by_block(r: dict) -> str:
    """Every fixed block beside auto, laid out as the dated runs below lay them out."""
    modes = [*r["speedup_by_block"], "auto"]
    speedup = r["speedup_by_block"] | {"auto": r["speedup_auto"]}
    tau = r["tau_by_block"] | {"auto": r["tau_auto"]}
    per_category = {c: blocks | {"auto": r["speedup_auto_by_category"][c]}
                    for c, blocks in r["speedup_by_block_by_category"].items()}
    rows = [["`speedup_by_block`, `speedup_auto`", *(cell(speedup[m]) for m in modes)],
            ["`speedup_range_over_repeats`", *("-".join(map(cell, r["speedup_range_over_repeats"][m])) for m in modes)],
            ["`tau_by_block`, `tau_auto`", *(cell(tau[m]) for m in modes)],
            ["decode tokens/s: speedup x `ar_tokens_per_s`", *(cell(speedup[m] * r["ar_tokens_per_s"]) for m in modes)],
            *([f"{c}: `speedup_by_block_by_category`, `speedup_auto_by_category`", *(cell(s[m]) for m in modes)]
              for c, s in per_category.items())]
    return table(["", *(f"block {m}" if m != "auto" else "**auto**" for m in modes)], rows)


def by_category(r: dict) -> str:
    """The bench's per-category numbers (bench.METRICS' `*_by_category` of one number a category), a column each."""
    names = [n for n in bench.METRICS if n.endswith("_by_category") and n in r
             and all(isinstance(v, float) for v in r[n].values())]
    rows = [[c, *(cell(r[n][c]) for n in names)] for c in r[names[0]]]
    return table(["category", *(f"`{n.removesuffix('_by_category')}`" for n in names)], rows)


def cost_curve(r: dict) -> str:
    """auto's input: ms a call against tokens, at each cache position timed (indexed as CostCurve reads it)."""
    header = ["tokens", *(f"target ms @{p}" for p in r["positions"]), *(f"draft ms @{p}" for p in r["positions"])]
    rows = [[str(t), *(cell(ms[t - 1]) for ms in r["target_ms"]),
             *(cell(ms[t - 2]) if t > 1 else "-" for ms in r["draft_ms"])]  # a draft call drafts 2 tokens or more
            for t in range(1, len(r["target_ms"][0]) + 1)]
    return table(header, rows)


def exports(sources: list[Source]) -> str:
    """The export stages' memory, a row a report (an empty report: a kind export.layout does not use)."""
    keys = list(dict.fromkeys(k for s in sources for k in s.data))
    rows = [[f"`{s.name}`", f"`dvc repro {s.stage}`", s.date, *(cell(s.data[k]) if k in s.data else "-" for k in keys)]
            for s in sources]
    return table(["report", "command", "date", *(f"`{k}`" for k in keys)], rows)


def section(reports: Path = REPORTS) -> str:
    """The generated region's markdown, from the reports in `reports` (the committed ones by default)."""
    lock = stages()
    run, curve, check, peers, training = (Source(reports, name, lock) for name in
                                          ["bench.json", "cost_curve.json", "validate.json", "peers.json",
                                           "train_draft/metrics.json"])
    built = [Source(reports, f"export_{kind}.json", lock) for kind in ["target", "draft", "single"]]
    parts = [("Bench, headline", run.caption(), headline(run.data)),
             ("Bench, per block", f"{run.caption()}; lossless above covers every mode", by_block(run.data)),
             ("Bench, per category", f"{run.caption()}; columns are its `*_by_category`", by_category(run.data)),
             ("Cost curve", f"{curve.caption()}; confidence {cell(curve.data['confidence_ms'])} ms a round",
              cost_curve(curve.data)),
             ("Validate", check.caption(), listed(check.data)),
             ("Export memory", "each row names its report, command and commit; an empty one is of a kind "
              "export.layout does not use", exports(built)),
             ("llama.cpp beside these programs", peers.caption(), listed(peers.data)),
             ("Draft training", training.caption(), listed(training.data))]
    return "\n\n".join(f"**{title}** ({caption}):\n\n{body}" for title, caption, body in parts)


def rewritten(doc: str, generated: str) -> str:
    """`doc` with the region between its markers replaced by `generated`, the rest as it was."""
    head, begin, rest = doc.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END)
    if not begin or not end:
        sys.exit(f"{DOC} has no region from {BEGIN} to {END} to write")
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def main(argv: list[str]) -> None:
    doc = DOC.read_text()
    new = rewritten(doc, section())
    if argv == ["--check"]:
        if new != doc:
            sys.exit(f"{DOC}'s committed-run tables differ from the reports; run python -m tools.measurements "
                     "and commit the doc with them")
    elif argv:
        sys.exit("usage: python -m tools.measurements [--check]")
    else:
        DOC.write_text(new)


if __name__ == "__main__":
    main(sys.argv[1:])
