"""Training a draft: the packed blocks' visibility and weights, the one draft definition in training
and inference, the checkpoint round trip, the mask token choice, and that it learns."""

import json
import math
import shutil
from functools import partial

import pytest
import torch

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.check import check_pair
from dflash_et.checkpoints.fetch import fetch
from dflash_et.checkpoints.pair import load_pair
from dflash_et.errors import CheckpointError
from dflash_et.training.blocks import draft_loss, loss_weights, pack
from dflash_et.training.data import Sequence
from dflash_et.training.train import TrainConfig, new_draft, train_draft
from tests.tiny_programs import validate_config

BLOCK = 6


@pytest.fixture(scope="module")
def setup(pair):
    target, _, _ = load_pair(*pair, max_seq_len=128)
    cfg, draft = new_draft(pair[0], target, TrainConfig(num_layers=2, block_size=BLOCK, max_seq_len=128))
    g = torch.Generator().manual_seed(0)
    seqs = []
    for length, prompt_len in ((40, 10), (25, 6)):
        tokens = torch.randint(0, target.args.vocab_size, (length,), generator=g)
        with torch.no_grad():
            _, taps = target(tokens[None], torch.arange(length))
        seqs.append(Sequence(tokens, taps[0], prompt_len))
    return target, draft, cfg["dflash_config"]["mask_token_id"], seqs


def test_packed_rows_see_their_own_sequence_before_the_anchor_and_their_own_block(setup):
    _, _, mask_id, seqs = setup
    anchors = [torch.tensor([3, 7]), torch.tensor([5])]
    batch = pack(seqs, anchors, 4, mask_id, gamma=7.0)
    packed = [(0, p) for p in range(7)] + [(1, p) for p in range(5)]  # each sequence's taps before its last anchor
    ctx = len(packed)
    assert batch.mask.shape == (12, ctx + 12) and batch.hidden.shape[1] == ctx
    assert batch.hidden[0, :7].equal(seqs[0].taps[:7]) and batch.hidden[0, 7:].equal(seqs[1].taps[:5])
    owners = [(0, 3), (0, 7), (1, 5)]
    for r in range(12):
        s, a = owners[r // 4]
        sees = [(i == s and p < a) for i, p in packed]
        assert batch.mask[r, :ctx].tolist() == sees
        assert batch.mask[r, ctx:].tolist() == [k // 4 == r // 4 for k in range(12)]
        assert int(batch.block_pos[r]) == a + r % 4
        if r % 4 == 0:
            assert int(batch.tokens[0, r]) == int(seqs[s].tokens[a]) and batch.labels[r] == -100
        else:
            assert batch.tokens[0, r] == mask_id and batch.labels[r] == seqs[s].tokens[a + r % 4]
    assert batch.weights.tolist()[:4] == pytest.approx([0.0, *loss_weights(4, 7.0).tolist()])


def test_rows_past_the_end_of_a_sequence_carry_no_loss(setup):
    _, _, mask_id, seqs = setup
    batch = pack(seqs[1:], [torch.tensor([23])], BLOCK, mask_id, gamma=7.0)  # only position 24 exists after it
    assert batch.labels.tolist() == [-100, int(seqs[1].tokens[24])] + [-100] * (BLOCK - 2)
    assert batch.weights.tolist() == [0.0, 1.0] + [0.0] * (BLOCK - 2)


def test_training_call_is_the_inference_draft_one_anchor_at_a_time(setup):
    """One `Draft`: the packed, masked training call (`packed`) equals the cached inference call per anchor."""
    _, draft, mask_id, seqs = setup
    anchors = [torch.tensor([5, 11, 30]), torch.tensor([8, 20])]
    batch = pack(seqs, anchors, BLOCK, mask_id, gamma=7.0)
    with torch.no_grad():
        every_row = torch.arange(batch.tokens.shape[1])
        packed = draft.packed(batch.tokens, batch.hidden, batch.ctx_pos, batch.block_pos, batch.mask,
                              every_row)[1][0].view(-1, BLOCK, draft.args.vocab_size)
        rows = [(s, a) for s, a_s in enumerate(anchors) for a in a_s.tolist()]
        for i, (s, a) in enumerate(rows):
            block = torch.tensor([[int(seqs[s].tokens[a])] + [mask_id] * (BLOCK - 1)])
            single = draft(block, seqs[s].taps[None, :a], torch.arange(a))
            torch.testing.assert_close(packed[i, 1:], single[0], rtol=1e-4, atol=1e-4)


def test_a_block_never_sees_taps_at_or_after_its_anchor(setup):
    _, draft, mask_id, seqs = setup
    anchors = [torch.tensor([12, 25])]
    with torch.no_grad():
        before = draft_loss(draft)(pack(seqs[:1], anchors, BLOCK, mask_id, 7.0))
        changed = Sequence(seqs[0].tokens, seqs[0].taps.clone(), seqs[0].prompt_len)
        changed.taps[25:] += 10.0
        assert draft_loss(draft)(pack([changed], anchors, BLOCK, mask_id, 7.0)) == before
        changed.taps[12:] += 10.0
        assert draft_loss(draft)(pack([changed], anchors, BLOCK, mask_id, 7.0)) != before


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "generate"])
def test_batched_replies_are_greedy_and_their_taps_are_the_targets(trained_pair, slots, monkeypatch):
    """Replies decoded 3 prompts at a time (different lengths; in slots refilled as replies end, or transformers'
    `generate` on left-padded batches, the families the slots do not run) are each prompt's own greedy reply, and
    their taps are what the target model computes over the whole sequence."""
    from dflash_et.checkpoints.load import eos_ids, load_target
    from dflash_et.data.chat import encode_chat, tokenizer
    from dflash_et.data.prompts import builtin_prompts
    from dflash_et.runtime.generate import generate_ar
    from dflash_et.training import replies
    from dflash_et.training.data import reply_model, target_sequences

    target_dir, layers = trained_pair[0], [1, 3]
    target, tok, eos = load_target(target_dir, layers, 256), tokenizer(target_dir), set(eos_ids(target_dir))
    prompts = [encode_chat(tok, r["prompt"]) for r in builtin_prompts(7, split="train")]
    assert len({len(p) for p in prompts}) > 1  # the batch is padded
    model = reply_model(target_dir, torch.device("cpu"))
    assert replies.slotted(model)
    monkeypatch.setattr(replies, "slotted", lambda _: slots)
    seqs = target_sequences(model, layers, prompts, 24, eos, batch=3)
    ended = [s for s in seqs if s.tokens[-1].item() in eos]
    assert ended and len(ended) < len(seqs)  # some replies end early (their slots refilled), some run to the limit
    for ids, seq in zip(prompts, seqs):
        assert seq.tokens[:len(ids)].tolist() == ids and seq.prompt_len == len(ids)
        assert seq.tokens[len(ids):].tolist() == generate_ar(target, ids, 24, eos, 256, 64).tokens
        with torch.no_grad():
            _, taps = target(seq.tokens[None], torch.arange(len(seq.tokens)))
        assert len(seq.tokens) - 1 <= len(seq.taps) <= len(seq.tokens)
        torch.testing.assert_close(seq.taps, taps[0, :len(seq.taps)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family, slots", [("qwen3", True), ("llama", True), ("qwen3_5_text", False),
                                           ("gemma4", False)])
def test_the_slots_run_the_families_whose_every_layer_is_full_attention(family, slots, tmp_path):
    """Qwen3 and Llama go through the slots; Qwen3.5's linear-attention layers and Gemma 4's sliding and shared K/V
    keep transformers' `generate`, which runs their caches as they need."""
    from transformers import AutoModelForCausalLM

    from dflash_et.training.replies import slotted
    from tests.tiny_checkpoints import random_checkpoint

    assert slotted(AutoModelForCausalLM.from_pretrained(random_checkpoint(tmp_path / family, family))) == slots


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "generate"])
def test_replies_past_the_deadline_are_the_first_prompts_taken(trained_pair, slots, monkeypatch):
    """With the clock run out, no prompt is taken after the first batch (3 of 7 here, a random sample of lengths),
    whose replies are finished and returned, and the log says how many were answered."""
    from dflash_et.checkpoints.load import eos_ids
    from dflash_et.data.chat import encode_chat, tokenizer
    from dflash_et.data.prompts import builtin_prompts
    from dflash_et.training import data, replies

    target_dir = trained_pair[0]
    tok, eos = tokenizer(target_dir), set(eos_ids(target_dir))
    prompts = [encode_chat(tok, r["prompt"]) for r in builtin_prompts(7, split="train")]
    monkeypatch.setattr(replies, "slotted", lambda _: slots)
    logs = []
    out = data.target_replies(data.reply_model(target_dir, torch.device("cpu")), prompts, 24, eos, batch=3,
                              deadline=0.0, log=logs.append)
    assert len(out) == 3 and all(out.values())
    assert logs == ["[train_draft] replies to 3 of 7 prompts: the clock (train_draft.minutes) leaves the rest of "
                    "the run to training"]


def test_the_compute_budget_caps_the_steps(setup):
    from dflash_et.training.train import planned_steps, step_macs

    _, draft, _, _ = setup
    config = TrainConfig(steps=50, batch=2, anchors=4, block_size=BLOCK)
    cost = step_macs(config, draft)
    rotations = sum((spec.num_heads + spec.num_kv_heads) * spec.head_dim ** 2 for spec in draft.args.layers)  # RoPE's
    assert cost == 2 * 4 * BLOCK * (2 * draft.lm_head.weight.numel() + 3 * sum(
        p.numel() for p in draft.parameters() if p.requires_grad) + 2 * rotations)
    assert planned_steps(config, draft) == 50
    assert planned_steps(TrainConfig(**{**config.__dict__, "compute_budget": 10.5 * cost}), draft) == 10
    assert planned_steps(TrainConfig(**{**config.__dict__, "compute_budget": 1.0}), draft) == 1


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_step_macs_is_what_a_training_step_multiplies(pair, variant):
    """One training step (draft_loss and its backward) of a 2-layer draft, every row with a loss (the count's upper
    bound) and no context taps (the step is all block rows): FlopCounterMode measures its matmuls, and step_macs is
    that plus, by hand, 3 x the products no matmul makes per row: the taps' projection fc (the count charges it
    per block row), the norms' weights, DFlash2's convolutions (2 layers x 2 around attention and MLP x 2 x K x H)
    and its selector's rank-wide product. The selector's codebooks add nothing: looked up, not multiplied (counted
    as weights, they made the built-in pair's DFlash2 step 1.08e10 instead of 7.55e9). Attention's products are
    left out of the count, and FlopCounterMode does not see CPU attention either: only matmuls are summed."""
    from torch.utils.flop_counter import FlopCounterMode

    from dflash_et.checkpoints.load import load_target
    from dflash_et.training.blocks import Batch
    from dflash_et.training.train import DFLASH2, step_macs

    rows, block = 24, 6
    config = TrainConfig(num_layers=2, block_size=block, batch=1, anchors=rows // block, max_seq_len=128,
                         variant=variant)
    target = load_target(pair[0], [1], 128)
    _, draft = new_draft(pair[0], target, config)
    g = torch.Generator().manual_seed(0)

    def words(n: int) -> torch.Tensor:
        return torch.randint(0, target.args.vocab_size, (n,), generator=g)

    blocks = torch.arange(rows) // block
    batch = Batch(words(rows)[None], torch.zeros(1, 0, draft.fc.in_features), torch.zeros(0, dtype=torch.long),
                  10 * blocks + torch.arange(rows) % block, blocks[:, None] == blocks[None, :], words(rows),
                  torch.ones(rows), words(rows), torch.arange(rows))
    with FlopCounterMode(display=False) as counter:
        draft_loss(draft)(batch).backward()
    flops = counter.get_flop_counts()["Global"]
    measured = sum(n for op, n in flops.items() if str(op) in ("aten.mm", "aten.addmm", "aten.bmm")) // 2
    norms = sum(p.numel() for name, p in draft.named_parameters() if name.endswith("norm.weight"))
    dflash2 = variant == "dflash2"
    convolutions = 2 * 2 * 2 * DFLASH2["conv_kernel_size"] * target.args.hidden_size if dflash2 else 0
    selector = DFLASH2["selector_rank"] if dflash2 else 0
    assert step_macs(config, draft) == measured + 3 * rows * (draft.fc.weight.numel() + norms + convolutions + selector)
    assert ("aten.bmm" in map(str, flops)) == dflash2  # the selector's candidate scores were measured


def test_loss_weights():
    w = loss_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1.0 and math.isclose(w[7].item(), math.exp(-1.0), rel_tol=1e-6)


def test_short_training_raises_heldout_acceptance_and_round_trips(trained_pair, tmp_path):
    config = TrainConfig(steps=80, num_prompts=12, heldout=3, max_new_tokens=24, block_size=8, anchors=8, batch=4,
                         max_seq_len=256, lr=2e-3)
    fetch("draft", "train", tmp_path / "draft", target_dir=trained_pair[0], train=partial(train_draft, config=config))
    report = json.loads((tmp_path / "draft" / "train_draft.json").read_text())
    assert report["heldout_tau"] > report["heldout_tau_untrained"] + 0.5, report
    assert "seconds" not in report and "timings" not in report  # a dependency: no clock values in it
    curve = (tmp_path / "draft" / "dvclive" / "plots" / "metrics" / "loss.tsv").read_text().splitlines()
    assert curve[0] == "step\tloss" and len(curve) == config.steps + 1
    assert float(curve[-1].split("\t")[1]) < float(curve[1].split("\t")[1])
    summary = json.loads((tmp_path / "draft" / "dvclive" / "metrics.json").read_text())
    assert summary["heldout_tau"] == report["heldout_tau"] and summary["steps"] == config.steps
    check_pair(trained_pair[0], tmp_path / "draft")  # z-lab layout, fits the target
    other = tmp_path / "other-target"  # same shapes, another checkpoint (here: one more config key)
    shutil.copytree(trained_pair[0], other)
    (other / "fingerprint.json").unlink()
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()), "note": "ft"}))
    with pytest.raises(CheckpointError, match="was trained for another target than .*other-target.*retrain it"):
        check_pair(other, tmp_path / "draft")
    saved = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert saved["block_size"] == config.block_size and saved["architectures"] == ["DFlashDraftModel"]
    _, _, settings = load_pair(trained_pair[0], tmp_path / "draft", max_seq_len=256)
    assert settings.block_size == config.block_size
    (tmp_path / "draft" / "train_draft.json").unlink()  # the way out the error names
    check_pair(other, tmp_path / "draft")


def test_fetching_draft_training_without_a_trainer_is_refused(pair, tmp_path):
    with pytest.raises(CheckpointError, match="model.draft=train needs a trainer"):
        fetch("draft", "train", tmp_path / "d", target_dir=pair[0])
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_mask_token_is_chosen_as_zlab_drafts_do(family, pair, tmp_path):
    """Qwen3: the first embedding row past the tokenizer (z-lab's Qwen3 drafts); Llama 3: the first reserved
    special token; a tokenizer with its own mask token (the built-in one): that token."""
    from transformers import AutoTokenizer

    from tests.tiny_checkpoints import chat_checkpoint

    target = chat_checkpoint(tmp_path / family, family)
    tok = AutoTokenizer.from_pretrained(target)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    chosen = zlab.choose_mask_token(target, vocab)
    if family == "qwen3":
        assert len(tok) < vocab and chosen == len(tok)
    else:
        assert len(tok) == vocab and tok.convert_ids_to_tokens(chosen) == "<|reserved_special_token_0|>"
    builtin_tok = AutoTokenizer.from_pretrained(pair[0])
    assert builtin_tok.convert_ids_to_tokens(zlab.choose_mask_token(pair[0], 2048)) == "<|mask|>"


def test_a_tokenizer_with_no_free_token_needs_the_param(tmp_path):
    from tests.tiny_checkpoints import chat_checkpoint

    target = chat_checkpoint(tmp_path / "t", "qwen3")
    full = len(__import__("transformers").AutoTokenizer.from_pretrained(target))
    with pytest.raises(CheckpointError, match="fills all .* embedding rows .* train_draft.mask_token_id"):
        zlab.choose_mask_token(target, full)


def test_mask_token_param_outside_the_vocab_is_refused(pair, tmp_path):
    with pytest.raises(ValueError, match="train_draft.mask_token_id=99999 is outside"):
        train_draft(pair[0], tmp_path / "d", TrainConfig(steps=1, num_prompts=2, heldout=1, mask_token_id=99999))
    assert not (tmp_path / "d").exists()


@pytest.mark.slow  # lowers programs
def test_draft_for_a_qwen3_target_without_a_mask_token_trains_exports_validates_and_benches(tmp_path):
    """What `dvc exp run -S model.target=<local Qwen3 checkpoint> -S model.draft=train` runs (the pipeline
    test drives the Llama layout through DVC itself)."""
    from dflash_et.evaluate.bench import BenchConfig, run_bench
    from dflash_et.evaluate.validate import validate
    from tests.tiny_checkpoints import chat_checkpoint
    from tests.tiny_programs import build_programs

    chat_checkpoint(tmp_path / "source", "qwen3")
    fetch("target", str(tmp_path / "source"), tmp_path / "target")
    config = TrainConfig(steps=30, num_prompts=12, heldout=2, max_new_tokens=16, block_size=4, anchors=4,
                         max_seq_len=128)
    fetch("draft", "train", tmp_path / "draft", target_dir=tmp_path / "target", train=partial(train_draft, config=config))
    mask = json.loads((tmp_path / "draft" / "config.json").read_text())["dflash_config"]["mask_token_id"]
    assert mask == len(__import__("transformers").AutoTokenizer.from_pretrained(tmp_path / "target"))
    programs = build_programs((tmp_path / "target", tmp_path / "draft"), tmp_path / "build", stock_forward=False)
    report = validate(programs, tmp_path / "target", tmp_path / "draft", validate_config(prompts=2, max_new_tokens=12))
    assert report["failures"] == [] and report["lossless"], report
    metrics, _, _ = run_bench(programs, 4, BenchConfig(num_prompts=2, max_new_tokens=8, repeats=1, latency_repeats=1,
                                                    block_sizes=(4,)))
    assert metrics["lossless"] and metrics["tau"] >= 1.0


def test_torchrun_two_ranks_step_together(pair, tmp_path):
    """Data-parallel training under `torchrun --nproc_per_node=2` (gloo on CPU): the ranks draw different
    batches, DistributedDataParallel averages their gradients, and both end with the same draft."""
    import subprocess
    import sys
    from pathlib import Path

    from tests import REPO

    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\nfrom pathlib import Path\nimport dflash_et\n"
        "from dflash_et.training.train import TrainConfig, train_draft\n"
        "config = TrainConfig(steps=4, num_prompts=4, heldout=1, max_new_tokens=8, block_size=4, anchors=4, batch=2)\n"
        "train_draft(Path(sys.argv[1]), Path(sys.argv[2]) / f\"rank{os.environ['RANK']}\", config)\n")
    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(script), str(pair[0]), str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rank0, rank1 = ((tmp_path / f"rank{i}" / "model.safetensors").read_bytes() for i in (0, 1))
    assert rank0 == rank1
    initial = zlab.init_draft_weights(json.loads((tmp_path / "rank0" / "config.json").read_text()), seed=0)
    trained = __import__("safetensors.torch", fromlist=["load_file"]).load_file(tmp_path / "rank0" / "model.safetensors")
    assert not torch.equal(trained["fc.weight"], initial["fc.weight"])
