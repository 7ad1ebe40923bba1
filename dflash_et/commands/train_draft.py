"""`dflash train-draft`: a DFlash draft for any target, outside the pipeline, on a GPU when there is one
(dflash_et/training/standalone.py)."""

import argparse
import shlex
from pathlib import Path

DESCRIPTION = (
    "Train a DFlash draft for TARGET (fetched as the pipeline fetches model.target: a .gguf file, a Hugging Face "
    "checkpoint directory, or a built-in name) with params.yaml's train_draft section (run it from the project's "
    "root), each --set over it; write the draft in z-lab's layout to OUT with its card, train_draft.json (seconds "
    "per phase, throughput, device, versions, this command). Ship it as drafts/<name>/ and `model.draft: auto` "
    "takes it for that target. Costs: the clock (--minutes bounds the whole command; without it train_draft.steps "
    "and compute_budget decide: with the default settings ~25 minutes for SmolLM2 on a 2-core CPU, an H200 is "
    "meant to take --minutes 8.5); memory: the target's weights in fp32 beside the draft it trains; a CUDA GPU "
    "when there is one (--device), else the CPU. It needs only torch, transformers, safetensors, tokenizers and "
    "PyYAML (gguf and accelerate for a .gguf target): no ExecuTorch and no DVC, so a bare GPU machine runs it as "
    "`python -m dflash_et.cli train-draft ...` (tools/gpu/train_smollm2.sh), and under `torchrun "
    "--nproc_per_node=N -m dflash_et.cli train-draft ...` it trains data-parallel (only rank 0 writes).")


def add(sub: argparse._SubParsersAction) -> None:
    from dflash_et.training.config import DEVICES

    t = sub.add_parser("train-draft", help="train a draft for any target, outside the pipeline (GPU or CPU)",
                       description=DESCRIPTION)
    t.set_defaults(run=train)
    t.add_argument("target", metavar="TARGET",
                   help="a .gguf file, a checkpoint directory, or a built-in name (smollm2, builtin)")
    t.add_argument("out", type=Path, metavar="OUT",
                   help="the draft's folder (z-lab layout and its card), written whole or not at all")
    t.add_argument("--minutes", type=float, help="wall clock of the whole command: training ends sooner to fit "
                   "(train_draft.minutes; default: none, train_draft.steps and compute_budget decide)")
    t.add_argument("--device", choices=DEVICES,
                   help="train_draft.device (auto: CUDA when there is one; on a 2-core CPU the default settings "
                        "take ~25 minutes for SmolLM2, an H200 is meant to take --minutes 8.5)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a train_draft setting of params.yaml, repeatable: --set synthetic_prompts=12000")
    t.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="the saved weights' (bf16: half the size, how a draft ships in drafts/)")
    t.add_argument("--resume", type=Path, metavar="DIR",
                   help="a campaign's state: continue the run DIR holds (replies, draft, optimizer, step), or start "
                        "one there if DIR is new or empty; written every train_draft.save_minutes and at the end, "
                        "so a stopped run loses at most that much")
    t.add_argument("--shard-mb", type=float, help="weights in files of at most this many MB, with an index "
                   "(a device machine returns files of at most 16 MiB; a DFlash2 draft's codebooks are larger)")


def train(args: argparse.Namespace) -> None:
    from dflash_et import show_progress
    from dflash_et.training.standalone import settings, train_outside

    show_progress()
    config = settings(args.target, args.set, args.minutes, args.device)
    train_outside(args.target, args.out, config, shlex.join(["dflash", *args.argv]), args.dtype, args.shard_mb,
                  args.resume)
