"""package stage: `python -m stages.package TARGET_BUILD DRAFT_BUILD TARGET_DIR OUT`: the shippable
programs directory (target.pte, draft.pte, shared.ptd when weights are shared, the tokenizer)."""

from pathlib import Path

from dflash_et.export.package import package
from dflash_et.files import staged_dir
from stages.common import run


def main(argv: list[str]) -> None:
    target_build, draft_build, target_dir, out = map(Path, argv)
    with staged_dir(out) as tmp:
        summary = package([target_build, draft_build], tmp, target_dir)
    if summary["shared_weights"]:
        s = summary["shared_weights"]
        print(f"[package] shared.ptd {s['shared_bytes'] / 1e6:.1f} MB, {s['bytes_saved'] / 1e6:.1f} MB saved "
              f"against separate weights", flush=True)


if __name__ == "__main__":
    run(main)
