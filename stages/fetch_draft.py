"""fetch_draft stage: `python -m stages.fetch_draft TARGET_DIR OUT` puts the draft named by model.draft
at OUT, checked against the target; `model.draft: train` trains one for it (the train_draft section)."""

from functools import partial
from pathlib import Path

from dflash_et.checkpoints.fetch import fetch
from dflash_et.training.train import TrainConfig, train_draft
from stages.common import params, run


def main(argv: list[str]) -> None:
    target_dir, out = map(Path, argv)
    p = params()
    embed_scale = p["model"].get("draft_embed_scale")
    trainer = partial(train_draft, config=TrainConfig(**(p.get("train_draft") or {}), embed_scale=embed_scale))
    fetch("draft", str(p["model"]["draft"]), out, target_dir=target_dir, train=trainer, embed_scale=embed_scale)


if __name__ == "__main__":
    run(main)
