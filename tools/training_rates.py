"""What a draft's training costs on this machine, part by part (docs/measurements.md#a-draft-from-two-cpu-cores):
`steps`: seconds per training step (pack, forward, backward, optimizer) and block rows/s for SmolLM2's draft, the
pilot's recipe (full head, one dense masked attention) beside today's (attention per sequence, a reduced head), at
each precision given; `replies`: the target's greedy reply tokens/s (transformers' `generate`, and the slots
that refill finished rows) and tap tokens/s. Run it alone on the machine,
venv active, from the repository's root: `python -m tools.training_rates steps --precision fp32 bf16`.
bf16 is autocast for steps and the model's dtype for replies, as train_draft.precision uses them."""

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_et.checkpoints.fetch import fetch
from dflash_et.checkpoints.load import load_target
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import load_prompts
from dflash_et.models.draft import reduce_head
from dflash_et.runtime.sampling import Sampling
from dflash_et.training.blocks import draft_loss, pack, sample_anchors
from dflash_et.training.config import TrainConfig
from dflash_et.training.data import Sequence, reply_model, tapped
from dflash_et.training.replies import generated, replies as slotted
from dflash_et.training.train import new_draft

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RECIPES = {"pilot: full head, dense attention": (None, False), "full head, per-sequence attention": (None, True),
           "head 8192, per-sequence attention": (8192, True), "head 4096, per-sequence attention": (4096, True)}


def steps(target_dir: Path, dtype: torch.dtype, repeats: int = 3) -> dict:
    """Median seconds of each part of a step (batch 16, 16 anchors, block 16, sequences of 200 tokens) per recipe."""
    target, out = load_target(target_dir, [1, 27], 512), {}
    for name, (head, per_sequence) in RECIPES.items():
        _, draft = new_draft(target_dir, target, TrainConfig(batch=16, anchors=16, block_size=16))
        if head:
            reduce_head(draft, list(range(head)))
        loss_fn, params = draft_loss(draft), [p for p in draft.parameters() if p.requires_grad]
        opt, g = torch.optim.AdamW(params, lr=1e-3), torch.Generator().manual_seed(0)
        seqs = [Sequence(torch.randint(0, target.args.vocab_size, (200,), generator=g),
                         torch.randn(199, draft.fc.in_features, generator=g), 70) for _ in range(32)]
        parts = []
        for i in range(repeats + 1):  # the first is a warmup
            picks = [seqs[j] for j in torch.randint(0, len(seqs), (16,), generator=g).tolist()]
            t0 = time.perf_counter()
            batch = pack(picks, [sample_anchors(s, 16, g) for s in picks], 16, 0, 7.0)
            batch = batch if per_sequence else replace(batch, segments=None)
            t1 = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn(batch)
            t2 = time.perf_counter()
            opt.zero_grad()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            parts.append((t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3, batch.tokens.shape[1]))
        median = [sorted(x)[len(x) // 2] for x in zip(*parts[1:])]
        out[name] = dict(zip(("pack", "forward", "backward", "optimizer", "rows"), median)) | {
            "rows_per_s": median[4] / sum(median[:4])}
        print(name, {k: round(v, 3) for k, v in out[name].items()}, flush=True)
    return out


def replies(target_dir: Path, dtype: torch.dtype, prompts: int = 192, batch: int = 96) -> dict:
    """Reply tokens/s (greedy, 128 tokens at most, `batch` at a time) through transformers' `generate` and through
    the slots that refill finished rows (training.replies), and tap tokens/s over prompt + reply."""
    tok, model = tokenizer(target_dir), reply_model(target_dir, torch.device("cpu"), dtype)
    ids = [encode_chat(tok, r["prompt"]) for r in load_prompts("assistant", prompts, split="train")]
    order, eos, out = sorted(range(len(ids)), key=lambda i: len(ids[i])), {tok.eos_token_id}, {}
    for name, decode in (("generate", generated), ("slots", slotted)):
        started = time.perf_counter()
        with torch.no_grad():
            answers = decode(model, ids, order, 128, eos, batch, lambda: False, Sampling(), 0, tqdm(disable=True))
        out[f"{name}_reply_tokens_per_s"] = sum(map(len, answers.values())) / (time.perf_counter() - started)
    started = time.perf_counter()
    tapped(model, [1, 27], [(ids[i] + answers[i], len(ids[i])) for i in answers], taps_dtype=dtype)
    out["tap_tokens_per_s"] = sum(len(ids[i]) + len(a) for i, a in answers.items()) / (time.perf_counter() - started)
    print(out, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("steps", "replies"))
    parser.add_argument("--precision", nargs="+", choices=tuple(DTYPES), default=["fp32"])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    target_dir = Path("/tmp/training_rates/smollm2")
    if not (target_dir / "config.json").is_file():
        fetch("target", "smollm2", target_dir)
    measure = steps if args.what == "steps" else replies
    figures = {p: measure(target_dir, DTYPES[p]) for p in args.precision}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
