"""validate stage: artifacts/reports/validate.json (a DVC metric); fails when any check does."""

import sys

from dflash_et.files import write_json
from dflash_et.validate import ValidateConfig, validate
from stages.common import PROGRAMS, REPORTS, WEIGHTS, params, run


def main() -> None:
    report = validate(PROGRAMS, WEIGHTS / "target", WEIGHTS / "draft", ValidateConfig.from_params(params()["validate"]))
    write_json(REPORTS / "validate.json", report)
    print(f"[validate] lossless={report['lossless']} ({report['lossless_fraction']:.0%} of runs) target_rel_err={report['target_rel_err']:.2e} "
          f"draft_rel_err={report['draft_rel_err']:.2e} token_agreement={report['token_agreement']:.4f}")
    if report["divergence"] and not report["failures"]:
        print(f"[validate] warning (allowed for reduced-precision programs): {report['divergence']}")
    if report["failures"]:
        sys.exit("error: validate failed: " + "; ".join(report["failures"]))


if __name__ == "__main__":
    run(main)
