"""Training a draft: the objective's masking and weights, the checkpoint round trip, and that it learns."""

import json
import math
import shutil

import pytest
import torch

from dflash_et.checkpoint import check_pair, fetch, load_pair
from dflash_et.model import CheckpointError
from dflash_et.train import (Sequence, TrainConfig, block_attention_mask, block_loss, loss_weights, new_draft,
                             training_logits)


@pytest.fixture(scope="module")
def setup(pair):
    target, _, _ = load_pair(*pair, max_seq_len=128)
    config = TrainConfig(num_layers=2, block_size=6, max_seq_len=128)
    cfg, draft = new_draft(pair[0], target, config)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2048, (40,), generator=g)
    with torch.no_grad():
        _, taps = target(tokens[None], torch.arange(40))
    return target, draft, cfg, Sequence(tokens, taps[0], 10)


def test_mask_sees_only_context_before_the_anchor_and_its_own_block():
    anchors, block, ctx = torch.tensor([3, 7]), 4, 8
    mask = block_attention_mask(ctx, anchors, block)
    assert mask.shape == (8, 16)
    for q in range(8):
        i = q // block
        assert mask[q, :ctx].tolist() == [k < anchors[i] for k in range(ctx)]
        assert mask[q, ctx:].tolist() == [k // block == i for k in range(8)]


def test_block_never_sees_taps_at_or_after_its_anchor(setup):
    _, draft, cfg, seq = setup
    mask_id = cfg["dflash_config"]["mask_token_id"]
    anchors = torch.tensor([12, 25])
    with torch.no_grad():
        before = training_logits(draft, seq, anchors, 6, mask_id)
        changed = Sequence(seq.tokens, seq.taps.clone(), seq.prompt_len)
        changed.taps[12:] += 10.0
        after = training_logits(draft, changed, anchors, 6, mask_id)
    torch.testing.assert_close(after[0], before[0])  # anchor 12: taps 12.. are invisible
    assert not torch.allclose(after[1], before[1])  # anchor 25 sees taps 12..24


def test_training_forward_equals_inference_forward(setup, pair):
    """The batched training math is the cached inference draft, one anchor at a time."""
    _, draft, cfg, seq = setup
    mask_id = cfg["dflash_config"]["mask_token_id"]
    anchors = torch.tensor([5, 11, 30])
    with torch.no_grad():
        batched = training_logits(draft, seq, anchors, 6, mask_id)
        for i, a in enumerate(anchors.tolist()):
            block = torch.tensor([[int(seq.tokens[a])] + [mask_id] * 5])
            single = draft(block, seq.taps[None, :a], torch.arange(a))
            torch.testing.assert_close(batched[i:i + 1], single, rtol=1e-4, atol=1e-5)


def test_loss_weights_and_ignored_positions(setup):
    w = loss_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1.0 and math.isclose(w[7].item(), math.exp(-1.0), rel_tol=1e-6)
    _, _, _, seq = setup
    logits = torch.zeros(1, 5, 2048)
    logits[0, :, 0] = 50.0  # confidently wrong everywhere ...
    loss_end = block_loss(logits, seq, torch.tensor([38]), loss_weights(6, 7.0))  # only position 39 exists
    logits[0, 0, 0], logits[0, 0, int(seq.tokens[39])] = 0.0, 50.0  # ... except the one real position
    assert loss_end.item() > 40 and block_loss(logits, seq, torch.tensor([38]), loss_weights(6, 7.0)).item() < 1e-3


def test_short_training_raises_heldout_acceptance_and_round_trips(pair, tmp_path):
    config = TrainConfig(steps=80, num_prompts=12, heldout=3, max_new_tokens=24, block_size=8, anchors=8, batch=4,
                         max_seq_len=256, lr=2e-3)
    fetch("draft", "train", tmp_path / "draft", target_dir=pair[0], train=config)  # model.draft: train
    report = json.loads((tmp_path / "draft" / "train_draft.json").read_text())
    assert report["heldout_tau"] > report["heldout_tau_untrained"] + 0.5, report
    curve = (tmp_path / "draft" / "train_loss.csv").read_text().splitlines()
    assert curve[0] == "step,loss" and len(curve) == 81
    assert float(curve[-1].split(",")[1]) < float(curve[1].split(",")[1])
    check_pair(pair[0], tmp_path / "draft")  # z-lab layout, fits the target
    other = tmp_path / "other-target"  # same shapes, another checkpoint (here: one more config key)
    shutil.copytree(pair[0], other)
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()), "note": "ft"}))
    with pytest.raises(CheckpointError, match="was trained for another target than .*other-target.*retrain it"):
        check_pair(other, tmp_path / "draft")
    saved = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert saved["block_size"] == 8 and saved["architectures"] == ["DFlashDraftModel"]
    target, draft, settings = load_pair(pair[0], tmp_path / "draft", max_seq_len=256)
    assert settings.block_size == 8
    (tmp_path / "draft" / "train_draft.json").unlink()  # the way out the error names
    check_pair(other, tmp_path / "draft")
