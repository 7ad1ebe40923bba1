"""fetch_draft stage: `python -m stages.fetch_draft TARGET_DIR OUT LIVE_DIR` puts the draft named by
model.draft at OUT, checked against the target; `model.draft: train` trains one for it (the train_draft
section), and `auto` does when no draft in drafts/ was trained for it, logging to LIVE_DIR with DVCLive (its metrics.json is the stage's metric; a draft that was
not trained here gets `{"trained": false}`)."""

from functools import partial
from pathlib import Path

from dflash_et.checkpoints.fetch import fetch
from dflash_et.files import staged_dir, write_json
from dflash_et.params import params
from dflash_et.training.config import train_config
from dflash_et.training.train import train_draft
from stages.common import run


def main(argv: list[str]) -> None:
    target_dir, out, live_out = map(Path, argv)
    p = params()
    with staged_dir(live_out) as live_dir:
        trainer = partial(train_draft, config=train_config(p), live_dir=live_dir)
        fetch("draft", str(p["model"].draft), out, target_dir=target_dir, train=trainer,
              embed_scale=p["model"].draft_embed_scale)
        if not (live_dir / "metrics.json").exists():  # every output dvc.yaml declares exists
            write_json(live_dir / "metrics.json", {"trained": False})
            (live_dir / "plots" / "metrics").mkdir(parents=True)
            for name in ("loss", "lr"):  # DVCLive's TSV, header only
                (live_dir / "plots" / "metrics" / f"{name}.tsv").write_text(f"step\t{name}\n")


if __name__ == "__main__":
    run(main)
