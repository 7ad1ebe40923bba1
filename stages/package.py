"""package stage: the shippable artifacts/programs/ (target.pte, draft.pte, shared.ptd when weights are shared)."""

from dflash_et.export import PROGRAM_KINDS, package
from dflash_et.files import staged_dir
from stages.common import BUILD, PROGRAMS, run


def main() -> None:
    with staged_dir(PROGRAMS) as tmp:
        summary = package([BUILD / kind for kind in PROGRAM_KINDS], tmp)
    if summary["shared_weights"]:
        s = summary["shared_weights"]
        print(f"[package] shared.ptd {s['shared_bytes'] / 1e6:.1f} MB, {s['bytes_saved'] / 1e6:.1f} MB saved "
              f"against separate weights", flush=True)


if __name__ == "__main__":
    run(main)
