"""export stage: `python -m stages.export target|draft TARGET_DIR DRAFT_DIR OUT` lowers one program."""

from pathlib import Path

from dflash_et.export.lower import ExportConfig, export_program
from dflash_et.files import staged_dir
from stages.common import params, run


def main(argv: list[str]) -> None:
    kind, target_dir, draft_dir, out = argv
    config = ExportConfig.from_params(params()["export"])
    with staged_dir(Path(out)) as tmp:
        export_program(kind, Path(target_dir), Path(draft_dir), config, tmp)


if __name__ == "__main__":
    run(main)
