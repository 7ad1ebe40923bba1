"""The `train_draft` section of params.yaml, and the device training runs on."""

import os
from dataclasses import dataclass

import torch

from dflash_et.params import parse

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class TrainConfig:
    """The `train_draft` section of params.yaml (what each setting does: its comment there)."""

    steps: int = 2000             # at most; see compute_budget and minutes
    compute_budget: float | None = 1.0e14  # multiply-accumulates a run may spend (None: no cap); see planned_steps
    minutes: float | None = None  # wall clock of the whole run (data, training, evaluation); None: no limit
    lr: float = 1e-3
    batch: int = 4                # sequences per step (per rank)
    block_size: int = 16
    anchors: int = 16             # anchors sampled per sequence
    gamma: float = 7.0
    num_layers: int = 2
    prompts: str = "builtin"      # builtin | assistant | a JSONL file (see prompts.load_prompts)
    num_prompts: int = 768
    synthetic_prompts: int = 0    # prompts the target writes itself, added to num_prompts (training.synthesize)
    heldout: int = 12             # prompts kept out of training, for the acceptance estimate
    curve_points: int = 0         # held-out tau measured this many times during training too (the card's curve)
    max_new_tokens: int = 48
    generate_batch: int = 16      # prompts per batched generation of the target's replies
    max_seq_len: int = 512        # positions the target and the draft hold while training (stages: export.max_seq_len)
    long_prompts: float = 0.0     # share of the prompts (training and held-out) asked after a document (long_rows)
    mask_token_id: int | None = None  # None: chosen from the tokenizer (see zlab.choose_mask_token)
    embed_scale: float | None = None  # model.draft_embed_scale: None, the target's own (see zlab.DraftSettings)
    sliding_window: int | None = None  # every draft layer attends this far back (zlab.DraftSettings.context_window)
    variant: str = "dflash"       # dflash | dflash2 (DFLASH2's parts, its selector trained with the draft)
    device: str = "auto"          # auto | cpu | cuda
    seed: int = 0


def train_config(p: dict) -> TrainConfig:
    """params.yaml's train_draft section (`p`: as dflash_et.params.params reads it), with the draft's embedding
    scale from model.draft_embed_scale and its positions from export.max_seq_len: a draft is trained for the
    context its program holds."""
    return parse(TrainConfig, p.get("train_draft"), "train_draft",
                 outside={"embed_scale": p["model"].draft_embed_scale, "max_seq_len": p["export"]["max_seq_len"]})


def training_device(config: TrainConfig) -> torch.device:
    """Where the draft trains and the target writes its replies: `auto` is CUDA when there is one (under torchrun
    the rank's own GPU), else the CPU. Asking for CUDA without one is refused in one line, before anything runs."""
    if config.device not in DEVICES:
        raise ValueError(f"train_draft.device={config.device!r} is not one of {', '.join(DEVICES)}")
    cuda = torch.cuda.is_available()
    if config.device == "cuda" and not cuda:
        raise ValueError(f"train_draft.device=cuda, but this torch ({torch.__version__}) sees no CUDA GPU; "
                         "use cpu or auto")
    if config.device == "cpu" or not cuda:
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
