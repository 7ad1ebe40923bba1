"""Small trained targets of the Gemma 4 and Qwen3.5 families, kept in tests/targets/<family>: `dflash serve`'s
tests run ExecuTorch's contract suite whole on them, whose tool-call test needs a target that calls a declared tool
(a random one writes no call). Training one takes minutes on two cores, too long for every CI run, so they are
made once and committed (3 MB each, tokenizer included); `python -m tests.family_targets` makes them again
(after a change to a family's built-in config or chat template)."""

import sys
from pathlib import Path

from tests.tiny_checkpoints import GEMMA_SHAPE, SMALL_TARGET, SMALL_TARGET_TRAINING

TARGETS = Path(__file__).parent / "targets"

# SMALL_TARGET's size in each family's layout: Gemma 4's sliding (window 4, shorter than the tests' calls, so the
# ring caches wrap) and full layers with their own head dims; Qwen3.5's DeltaNet and gated attention layers in turn
SHAPES = {
    "gemma4": SMALL_TARGET | dict(head_dim=24, global_head_dim=48, sliding_window=4,
                                  layer_types=GEMMA_SHAPE["layer_types"], num_hidden_layers=6),
    "qwen3_5": SMALL_TARGET | dict(head_dim=24, full_attention_interval=2, linear_num_key_heads=2,
                                   linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24),
}


def family_target(family: str) -> Path:
    """The committed trained target of `family`, or a one-line failure naming the command that makes it."""
    path = TARGETS / family
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m tests.family_targets {family}`")
    return path


def main(families: list[str]) -> None:
    from dflash_et.checkpoints import builtin

    for family in families or SHAPES:
        builtin.write_target(TARGETS / family, shape=SHAPES[family], training=SMALL_TARGET_TRAINING, family=family)


if __name__ == "__main__":
    main(sys.argv[1:])
