"""export stage: `python -m stages.export target|draft|single TARGET_DIR DRAFT_DIR OUT [MEMORY_REPORT]` lowers one
program (or, for a kind export.layout does not use, writes its summary alone); MEMORY_REPORT (a DVC metric)
gets the export's peak resident memory."""

from pathlib import Path

from dflash_et.export.config import ExportConfig
from dflash_et.export.lower import export_program
from dflash_et.files import staged_dir
from dflash_et.params import params
from stages.common import run


def main(argv: list[str]) -> None:
    kind, target_dir, draft_dir, out, *memory_report = argv
    # export.gguf is the package stage's (llama.cpp copies of the weights), not a setting of the programs
    config = ExportConfig.from_params({k: v for k, v in params()["export"].items() if k != "gguf"})
    with staged_dir(Path(out)) as tmp:
        export_program(kind, Path(target_dir), Path(draft_dir), config, tmp,
                       Path(memory_report[0]) if memory_report else None)


if __name__ == "__main__":
    run(main)
