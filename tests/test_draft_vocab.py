"""export.draft_vocab: the draft's head over the tokens its target emits, placed back in the full vocabulary."""

import pytest
import torch

from tests.conftest import REDUCED_VOCAB, chat_checkpoint, random_draft, validate_config
from dflash_et.data.emitted import TOKEN_COUNTS, coverage, kept_ids, read_counts, write_counts
from dflash_et.errors import ExportError
from dflash_et.export.lower import ExportConfig, load_models


def test_kept_ids_take_the_specials_then_the_most_emitted_then_the_lowest_ids():
    counts = {9: 5, 7: 5, 40: 2, 99: 1}
    assert kept_ids(counts, 4, 100, always={50}) == [7, 9, 40, 50]  # ties: the lower id first
    assert kept_ids(counts, 7, 100, always={50}) == [0, 1, 7, 9, 40, 50, 99]
    assert kept_ids({}, 3, 10, always={8}) == [0, 1, 8]
    assert coverage(counts, [7, 9]) == pytest.approx(10 / 13) and coverage({}, [1]) is None
    with pytest.raises(ValueError, match="at least the target's 2 special"):
        kept_ids(counts, 1, 100, always={1, 2})
    with pytest.raises(ValueError, match="at most its vocabulary of 100"):
        kept_ids(counts, 101, 100, always=set())


def test_counts_round_trip(tmp_path):
    write_counts(tmp_path, [[5, 6, 5], [5]])
    assert read_counts(tmp_path) == {5: 3, 6: 1} and list(read_counts(tmp_path)) == [5, 6]  # most emitted first
    assert read_counts(tmp_path / "none") == {}


@pytest.mark.parametrize("bad, message", [(0, "must be full or a number"), ("half", "must be full or a number")])
def test_bad_draft_vocab_is_one_line(bad, message):
    with pytest.raises(ExportError, match=message):
        ExportConfig.from_params({"draft_vocab": bad})
    with pytest.raises(ExportError, match="shared.ptd cannot share"):
        ExportConfig.from_params({"draft_vocab": 64, "shared_weights": True})


@pytest.mark.parametrize("family", ["qwen3", "gemma4_text"])
def test_a_reduced_head_scores_its_tokens_as_the_full_head_and_no_other(tmp_path, family):
    """A Qwen3- and a Gemma-4-shaped target (its logits softcapped) with a z-lab-layout draft: the reduced head's
    logits are the full head's at the kept ids (after scale and softcap) and -inf everywhere else, so its
    argmax and its softmax are the full ones restricted to the set."""
    target = chat_checkpoint(tmp_path / "target", family)
    draft = random_draft(tmp_path / "draft", target)
    write_counts(draft, [[300, 300, 301], [301, 300, 302]])
    size = 64
    full = load_models(target, draft, ExportConfig(max_seq_len=64), 64)
    reduced = load_models(target, draft, ExportConfig(max_seq_len=64, draft_vocab=size), 64)
    tokens, pos = torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.arange(6)
    with torch.no_grad():
        _, taps = full[0](tokens, pos)
        block = torch.tensor([[6] + [full[2].mask_token_id] * 7])
        ref, ours = full[1](block, taps, pos), reduced[1](block, taps, pos)
    kept = torch.isfinite(ours[0, 0]).nonzero().flatten()
    assert len(kept) == size and {300, 301, 302} <= set(kept.tolist())
    assert torch.isfinite(ours).sum() == size * ours.shape[1] and (ours[~torch.isfinite(ours)] == float("-inf")).all()
    torch.testing.assert_close(ours[..., kept], ref[..., kept], rtol=1e-5, atol=1e-5)
    assert reduced[1].lm_head.weight.shape[0] == size


def test_reduced_vocab_programs_validate_lossless_and_propose_only_kept_tokens(reduced_vocab_programs, trained_pair):
    """The exported reduced head through validate (numerics against its eager twin, greedy DFlash lossless, sampled
    DFlash with the target's distribution in both proposal modes), and its proposals only ever kept tokens."""
    from dflash_et.evaluate.validate import validate
    from dflash_et.runtime.programs import load_programs

    report = validate(reduced_vocab_programs, *trained_pair,
                      validate_config(sampling={"samples": 300, "prompts": 1}))
    assert not report["failures"], report["failures"]
    assert report["sampling"]["same_distribution"] and report["lossless"]
    target, draft = load_programs(reduced_vocab_programs)
    logits, taps = target(torch.tensor([[1, 2, 3]]), torch.arange(3))
    drafted = draft(torch.tensor([[3] + [draft.meta.mask_token_id] * 7]), taps, torch.arange(3))
    assert (torch.isfinite(drafted).sum(-1) == REDUCED_VOCAB).all()
    counts = read_counts(trained_pair[1])
    assert counts and (trained_pair[1] / TOKEN_COUNTS).is_file()
    top = sorted(counts, key=lambda t: -counts[t])[:100]
    assert torch.isfinite(drafted[0, 0, top]).all()  # the most emitted are kept
