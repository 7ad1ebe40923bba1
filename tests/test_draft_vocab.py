"""export.draft_vocab: the draft's head over the tokens its target emits, its N logits read by the runners at their ids."""

import shutil

import pytest
import torch

from tests.tiny_checkpoints import DFLASH2, chat_checkpoint, random_draft
from tests.tiny_programs import MAX_SEQ_LEN, PREFILL_CHUNK, REDUCED_VOCAB, validate_config
from dflash_et.data.emitted import TOKEN_COUNTS, coverage, kept_ids, read_counts, write_counts
from dflash_et.errors import ExportError
from dflash_et.export.config import ExportConfig
from dflash_et.export.loading import load_models
from dflash_et.runtime.sampling import Sampler

TOKENS, POS = torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.arange(6)


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
def test_a_reduced_head_scores_its_tokens_as_the_full_head(tmp_path, family):
    """A Qwen3- and a Gemma-4-shaped target (its logits softcapped) with a z-lab-layout draft: the reduced head's N
    logits are the full head's at `vocab_ids` (after scale and softcap), so its argmax and its softmax are the full
    ones restricted to the set."""
    target = chat_checkpoint(tmp_path / "target", family)
    draft = random_draft(tmp_path / "draft", target)
    write_counts(draft, [[300, 300, 301], [301, 300, 302]])
    size = 64
    full = load_models(target, draft, ExportConfig(max_seq_len=64), 64)
    reduced = load_models(target, draft, ExportConfig(max_seq_len=64, draft_vocab=size), 64)
    ids = reduced[1].vocab_ids
    assert full[1].vocab_ids is None and reduced[1].lm_head.weight.shape[0] == size
    assert len(set(ids.tolist())) == size and {300, 301, 302} <= set(ids.tolist())
    with torch.no_grad():
        _, taps = full[0](TOKENS, POS)
        block = torch.tensor([[6] + [full[2].mask_token_id] * 7])
        ref, ours = full[1](block, taps, POS), reduced[1](block, taps, POS)
    assert ours.shape == (1, 7, size)
    torch.testing.assert_close(ours, ref[..., ids], rtol=1e-5, atol=1e-5)


def test_a_reduced_dflash2_head_gives_the_same_lattice_when_its_candidates_are_kept(tmp_path):
    """A DFlash2 draft's lattice is of token ids: with its full head's candidates among the kept tokens, the reduced
    head's lattice is the full one (the selector's codebooks read token ids, not rows of the reduced head)."""
    target = chat_checkpoint(tmp_path / "target", "qwen3")
    draft = random_draft(tmp_path / "draft", target, **DFLASH2)
    full = load_models(target, draft, ExportConfig(max_seq_len=64), 64)
    with torch.no_grad():
        _, taps = full[0](TOKENS, POS)
        block = torch.tensor([[6] + [full[2].mask_token_id] * 7])
        ref = full[1](block, taps, POS)
    write_counts(draft, [ref[0].flatten().tolist()])  # the candidates are the most emitted tokens
    reduced = load_models(target, draft, ExportConfig(max_seq_len=64, draft_vocab=96), 64)
    with torch.no_grad():
        ours = reduced[1](block, taps, POS)
    assert torch.equal(ours[0], ref[0]) and not torch.equal(ours[0], torch.searchsorted(reduced[1].vocab_ids, ref[0]))
    torch.testing.assert_close(ours[1:], ref[1:], rtol=1e-5, atol=1e-5)


def test_quantized_programs_with_a_reduced_head_validate_against_the_fp32_models(programs, trained_pair, tmp_path):
    """validate's fp32 reference for reduced-precision programs loads the fp32 models with the programs' draft head:
    an 8da8w draft scoring 512 tokens beside the fp32 target is compared with a fp32 draft of 512 (it was compared
    with the full head, and failed on the shapes)."""
    from dflash_et.evaluate.validate import validate
    from dflash_et.export.lower import export_program

    shutil.copytree(programs, tmp_path / "programs")
    export_program("draft", *trained_pair, ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK,
                                                        quantize="8da8w", draft_vocab=REDUCED_VOCAB),
                   tmp_path / "programs")
    report = validate(tmp_path / "programs", *trained_pair, validate_config(sampling={"samples": 100, "prompts": 1}))
    assert report["lossless"] and 0 < report["fp32_reference"]["token_agreement"] <= 1
    assert report["draft_rel_err"] < 0.05


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
    assert drafted.shape == (1, 7, REDUCED_VOCAB) and len(set(draft.vocab_ids.tolist())) == REDUCED_VOCAB
    counts = read_counts(trained_pair[1])
    assert counts and (trained_pair[1] / TOKEN_COUNTS).is_file()
    top = sorted(counts, key=lambda t: -counts[t])[:100]
    assert set(top) <= set(draft.vocab_ids.tolist())  # the most emitted are kept
    proposals, _ = Sampler().propose(drafted[0], draft.vocab_ids, draft.meta.vocab_size)
    assert proposals == draft.vocab_ids[drafted[0].argmax(-1)].tolist()
