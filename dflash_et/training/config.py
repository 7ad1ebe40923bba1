"""The `train_draft` section of params.yaml, and the device training runs on."""

import os
from dataclasses import dataclass

import torch

from dflash_et.params import parse

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class TrainConfig:
    """The `train_draft` section of params.yaml (what each setting does: its comment there)."""

    steps: int = 2000
    compute_budget: float | None = 1.0e14
    minutes: float | None = None
    lr: float = 1e-3
    batch: int = 4
    block_size: int = 16
    anchors: int = 16
    gamma: float = 7.0
    num_layers: int = 2
    prompts: str = "builtin"
    num_prompts: int = 768
    synthetic_prompts: int = 0
    heldout: int = 12
    curve_points: int = 0
    max_new_tokens: int = 48
    generate_batch: int = 16
    max_seq_len: int = 512        # not a setting of the section: export.max_seq_len, the positions training holds
    long_prompts: float = 0.0
    mask_token_id: int | None = None
    embed_scale: float | None = None  # not a setting of the section: model.draft_embed_scale (zlab.DraftSettings)
    sliding_window: int | None = None
    variant: str = "dflash"
    device: str = "auto"
    precision: str = "fp32"
    head_vocab: str | int = "full"
    warm_start: bool = False
    save_minutes: float = 30.0
    data_share: float = 0.5
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


def has_fast_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 faster than fp32: a CUDA GPU, or a CPU with AMX or AVX-512 BF16 units (4-5x
    the fp32 rate on a Sapphire Rapids host). Elsewhere (AVX2 hosts, say) torch emulates bf16 products, about
    100x slower than fp32 (docs/measurements.md)."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def compute_dtype(config: TrainConfig, device: torch.device) -> torch.dtype:
    """What the target's replies and taps run in and training autocasts to: train_draft.precision, where `auto` is bf16
    on hardware that runs it fast (`has_fast_bf16`) and fp32 elsewhere. The draft's own weights and the optimizer
    stay fp32 either way."""
    if config.precision not in PRECISIONS:
        raise ValueError(f"train_draft.precision={config.precision!r} is not one of {', '.join(PRECISIONS)}")
    chosen = PRECISIONS[config.precision]
    if chosen is None:
        return torch.bfloat16 if has_fast_bf16(device) else torch.float32
    return chosen


def check_settings(config: TrainConfig) -> None:
    """train_draft.data_share is a share of the clock, head_vocab is `full` or a number of tokens, and a DFlash2
    draft's selector needs the full head."""
    if not 0 < config.data_share <= 1:
        raise ValueError(f"train_draft.data_share={config.data_share!r} must be a share of the clock in (0, 1] (0.5)")
    if config.head_vocab == "full":
        return
    if not isinstance(config.head_vocab, int) or isinstance(config.head_vocab, bool) or config.head_vocab < 1:
        raise ValueError(f"train_draft.head_vocab={config.head_vocab!r} must be full or a number of tokens (4096)")
    if config.variant == "dflash2":
        raise ValueError("train_draft.head_vocab trains a DFlash draft's head; a dflash2 draft's candidate selector "
                         "scores the whole vocabulary: set train_draft.head_vocab=full")
