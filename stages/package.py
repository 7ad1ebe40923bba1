"""package stage: `python -m stages.package TARGET_BUILD DRAFT_BUILD SINGLE_BUILD TARGET_DIR DRAFT_DIR OUT`: the
shippable programs directory (target.pte and draft.pte, or the single layout's target.pte; shared.ptd when weights
are shared; the tokenizer) and, with export.gguf, the target and the draft as GGUF files for llama.cpp users."""

from pathlib import Path

from dflash_et.checkpoints.load import has_draft
from dflash_et.errors import ExportError
from dflash_et.export.package import package
from dflash_et.files import staged_dir
from dflash_et.params import params
from dflash_et.peer.llama_cpp import Refused, gguf_pair
from stages.common import run


def main(argv: list[str]) -> None:
    *builds, target_dir, draft_dir, out = map(Path, argv)
    with staged_dir(out) as tmp:
        summary = package(builds, tmp, target_dir)
        if params()["export"].get("gguf"):
            config = summary["config"]
            try:
                files = gguf_pair(target_dir, draft_dir if has_draft(draft_dir) else None, tmp, config["quantize"],
                                  config["dtype"])
            except Refused as e:
                raise ExportError(f"export.gguf: llama.cpp does not take this checkpoint ({e}); set export.gguf=false")
            print(f"[package] for llama.cpp: {', '.join(p.name for p in files.values())}", flush=True)
    if summary["shared_weights"]:
        s = summary["shared_weights"]
        print(f"[package] shared.ptd {s['shared_bytes'] / 1e6:.1f} MB, {s['bytes_saved'] / 1e6:.1f} MB saved "
              f"against separate weights", flush=True)


if __name__ == "__main__":
    run(main)
