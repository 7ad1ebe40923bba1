"""The built-in corpus: seeded, and split so that no measured prompt is one a draft trained on."""

import pytest

from dflash_et.data.corpus import CATEGORIES, samples, split_of
from dflash_et.data.prompts import builtin_prompts
from dflash_et.training.train import TrainConfig, training_prompts


def test_samples_are_seeded():
    assert samples(30, seed=5) == samples(30, seed=5) != samples(30, seed=6)


def test_every_category_has_prompts_in_both_splits():
    rows = samples(600, seed=0)
    for category in CATEGORIES:
        assert {split_of(p) for c, p, _ in rows if c == category} == {"train", "eval"}, category


def test_draft_training_prompts_are_never_the_measured_ones():
    heldout, train = training_prompts(TrainConfig(num_prompts=600, heldout=30))
    measured = {r["prompt"] for r in builtin_prompts(600)}  # what validate and bench draw from
    assert {r["category"] for r in train} == set(CATEGORIES)
    assert not measured & {r["prompt"] for r in train}
    assert {split_of(r["prompt"]) for r in heldout} == {"eval"}


def test_a_prompt_file_keeps_its_first_rows_for_heldout(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(f'{{"prompt": "q{i}"}}\n' for i in range(5)))
    heldout, train = training_prompts(TrainConfig(prompts=str(path), num_prompts=3, heldout=2))
    assert [r["prompt"] for r in heldout] == ["q0", "q1"] and [r["prompt"] for r in train] == ["q2", "q3", "q4"]


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split 'test' is not one of"):
        samples(3, split="test")
