"""export stage: `python -m stages.export target|draft` lowers one program into artifacts/build/<kind>/."""

import sys

from dflash_et.export import ExportConfig, export_program
from dflash_et.files import staged_dir
from stages.common import BUILD, WEIGHTS, params, run


def main() -> None:
    kind = sys.argv[1]
    config = ExportConfig.from_params(params()["export"])
    with staged_dir(BUILD / kind) as tmp:
        export_program(kind, WEIGHTS / "target", WEIGHTS / "draft", config, tmp)


if __name__ == "__main__":
    run(main)
