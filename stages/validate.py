"""validate stage: `python -m stages.validate PROGRAMS TARGET_DIR DRAFT_DIR REPORT` writes the report
(a DVC metric) and fails when any check does; on a host that cannot run the programs it says so in one
line, writes a `skipped` report and succeeds."""

import sys
from pathlib import Path

from dflash_et.evaluate.validate import ValidateConfig, validate
from dflash_et.files import write_json
from dflash_et.params import params
from stages.common import run


def main(argv: list[str]) -> None:
    programs, target_dir, draft_dir, report_path = map(Path, argv)
    report = validate(programs, target_dir, draft_dir, ValidateConfig.from_params(params()["validate"]))
    write_json(report_path, report)
    if report.get("skipped"):
        print(f"[validate] skipped: {report['skipped']}")
        return
    draft = f"draft_rel_err={report['draft_rel_err']:.2e}" if "draft_rel_err" in report else "no draft (lookup)"
    print(f"[validate] lossless={report['lossless']} ({report['lossless_fraction']:.0%} of runs) "
          f"target_rel_err={report['target_rel_err']:.2e} {draft} token_agreement={report['token_agreement']:.4f}")
    q = report["quantized_model"]
    if "skipped" not in q:
        print(f"[validate] the quantization itself (the eager twin against the fp32 model): token agreement "
              f"{q['token_agreement']:.4f}, relative error {q['target_rel_err']:.2e} (as far may the target be from its twin)")
    s = report["sampling"]
    print(f"[validate] sampled DFlash vs target.pte's distribution: {s['tests']} chi-square tests over {s['samples']} "
          f"completions each, smallest p-value {s['min_p_value']:.3g} (threshold {s['threshold']:.2g}), largest total variation "
          f"{s['max_total_variation']:.3f}; tau " + ", ".join(f"{mode} {tau:.2f}" for mode, tau in s["tau"].items()))
    t = report["transformers"]
    print(f"[validate] target.pte vs transformers: skipped ({t['skipped']})" if "skipped" in t else
          f"[validate] target.pte vs transformers: logits {t['logits_rel_err']:.2e}, taps {t['taps_rel_err']:.2e} "
          f"(relative), greedy {'agrees' if not t['greedy_divergence'] else 'differs'}")
    if report["divergence"] and not report["failures"]:
        print(f"[validate] warning (allowed for reduced-precision programs): {report['divergence']}")
    if report["failures"]:
        sys.exit("error: validate failed: " + "; ".join(report["failures"]))


if __name__ == "__main__":
    run(main)
