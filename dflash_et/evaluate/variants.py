"""DFlash against DFlash2 drafts for one target, trained with the same budget and benched in one run
(`dflash compare`): how docs/measurements.md's DFlash/DFlash2 figures were measured; nothing here is a stage.

The target is fetched once; one draft is trained per `train_draft.variant` with params.yaml's train_draft section
otherwise unchanged (the same replies, seed and compute budget: `train.planned_steps` charges each variant what its
step multiplies); the target is exported once (its program depends on the layers its drafts tap and their block,
which the variants share) and each draft with the export section; the bench section runs on each pair of programs
in this one process, one variant after the other. Each step's output stays in the output folder and a rerun with
the same settings reuses it (a long run that failed late resumes); other settings are refused, in one line.
"""

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

from dflash_et.checkpoints.fetch import fetch
from dflash_et.errors import UserError
from dflash_et.evaluate import bench
from dflash_et.export.config import PROGRAM_KINDS, ExportConfig
from dflash_et.export.lower import export_program
from dflash_et.export.package import package
from dflash_et.files import staged_dir, write_json
from dflash_et.params import parse
from dflash_et.training.config import train_config
from dflash_et.training.train import train_draft

REPORTED = ("tau", "speedup", "tau_by_category", "speedup_by_category", "tau_by_block", "speedup_by_block",
            "tau_auto", "speedup_auto", "speedup_auto_by_category", "draft_ms_per_round", "verify_ms_per_round",
            "ar_ms_per_token", "lossless")


def once(out: Path, make) -> Path:
    """`make(dir)` into a staged directory that becomes `out`, unless an earlier run made `out` already."""
    if not out.exists():
        with staged_dir(out) as tmp:
            make(tmp)
    return out


def compare(out: Path, target: str, variants: list[str], p: dict) -> dict:
    """Per variant: its training's held-out tau and steps, and the bench metrics in REPORTED."""
    settings = {"target": target, "variants": variants, "train_draft": p.get("train_draft"), "export": p["export"],
                "bench": p.get("bench"), "block_size": p["block_size"]}
    recorded = out / "settings.json"
    if recorded.exists() and json.loads(recorded.read_text()) != json.loads(json.dumps(settings)):
        raise UserError(f"{out} holds a comparison made with other settings ({recorded}): pass a new OUT_DIR")
    write_json(recorded, settings)
    bench_config = parse(bench.BenchConfig, p.get("bench"), "bench")
    export_config = ExportConfig.from_params({k: v for k, v in p["export"].items() if k != "gguf"})
    target_dir = once(out / "target", lambda d: fetch("target", target, d))
    drafts = {variant: once(out / variant / "draft", lambda d: fetch(
        "draft", "train", d, target_dir=target_dir, embed_scale=p["model"].draft_embed_scale,
        train=partial(train_draft, config=replace(train_config(p), variant=variant)))) for variant in variants}
    # one target program for all: it depends on its drafts' tapped layers and block, which the variants share
    target_build = once(out / "build" / "target", lambda d: export_program("target", target_dir, drafts[variants[0]],
                                                                           export_config, d))
    results = {}
    for variant, draft_dir in drafts.items():
        builds = [target_build] + [once(out / variant / "build" / kind, lambda d: export_program(
            kind, target_dir, draft_dir, export_config, d)) for kind in PROGRAM_KINDS if kind != "target"]
        programs = once(out / variant / "programs", lambda d: package(builds, d, target_dir))
        trained = json.loads((draft_dir / "train_draft.json").read_text())
        metrics, _, _ = bench.run_bench(programs, p["block_size"], bench_config)
        results[variant] = {"heldout_tau": trained["heldout_tau"], "steps": trained["steps"],
                            **{name: metrics[name] for name in REPORTED if name in metrics}}
        if "skipped" in metrics:
            results[variant]["skipped"] = metrics["skipped"]
    write_json(out / "compare.json", results)
    return results


def table(results: dict) -> list[str]:
    """compare.json as text: a row per figure, a column per variant."""
    variants = list(results)
    rows = [("held-out tau (training)", "heldout_tau"), ("steps", "steps"), ("tau", "tau"), ("speedup", "speedup"),
            ("tau, auto", "tau_auto"), ("speedup, auto", "speedup_auto"), ("draft ms/round", "draft_ms_per_round"),
            ("verify ms/round", "verify_ms_per_round"), ("lossless", "lossless")]
    categories = sorted({c for r in results.values() for c in r.get("tau_by_category", {})})
    rows += [(f"tau, {c}", ("tau_by_category", c)) for c in categories]
    rows += [(f"speedup, {c}", ("speedup_by_category", c)) for c in categories]
    blocks = sorted({b for r in results.values() for b in r.get("tau_by_block", {})}, key=int)
    rows += [(f"tau, block {b}", ("tau_by_block", b)) for b in blocks]
    rows += [(f"speedup, block {b}", ("speedup_by_block", b)) for b in blocks]

    def value(result: dict, key) -> str:
        v = result.get(key[0], {}).get(key[1]) if isinstance(key, tuple) else result.get(key)
        return bench.shown(v)

    lines = [" | ".join(["", *variants])]
    lines += [" | ".join([label, *(value(results[v], key) for v in variants)]) for label, key in rows]
    return lines
