"""The built-in corpus: seeded, and split so that no measured prompt is one a draft trained on."""

import pytest

from dflash_et.data.corpus import CATEGORIES, samples, split_of
from dflash_et.data.prompts import builtin_prompts, text_of
from dflash_et.training.data import long_rows, training_prompts, with_long_rows
from dflash_et.training.train import TrainConfig


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


def _words(prompt) -> int:
    return len(text_of(prompt).split())


def test_long_rows_put_a_document_before_their_share_of_prompts_rising_to_the_room():
    rows = [{"category": "c", "prompt": f"question {i}?"} for i in range(8)]
    texts = [f"text {i} " + "word " * 9 for i in range(40)]
    out, again = long_rows([rows, rows[:4]], 0.25, texts, 200, _words)
    assert again[3] != rows[3] and again[3] != out[3] and again[:3] == rows[:3]  # each list its share; not the same
    changed = [i for i, (a, b) in enumerate(zip(rows, out)) if a != b]
    assert changed == [3, 7]  # a quarter, spread out
    lengths = [_words(out[i]["prompt"]) for i in changed]
    assert lengths[0] < lengths[1] <= 200 and lengths[1] > 150
    for i in changed:
        assert out[i]["prompt"].endswith(f"Question: question {i}?") and out[i]["category"] == "c"
    assert out[3]["prompt"].split("\n\n")[1] != out[7]["prompt"].split("\n\n")[1]  # each starts at another text


def test_long_prompts_in_training_come_from_the_train_split_and_a_bad_share_is_refused():
    config = TrainConfig(num_prompts=40, heldout=8, max_seq_len=512, long_prompts=0.5)
    heldout, train = with_long_rows(config, *training_prompts(config), _words)
    long = [r["prompt"] for r in heldout + train if r["prompt"].startswith("Read these notes")]
    assert len(long) == 24
    measured = {r["prompt"] for r in builtin_prompts(600)}
    assert not any(m in p.split("Question: ")[0] for p in long for m in measured)  # no measured prompt in a document
    assert with_long_rows(TrainConfig(), [{"prompt": "a"}], [], _words) == ([{"prompt": "a"}], [])
    with pytest.raises(ValueError, match=r"^train_draft.long_prompts=1.5 is a share of the prompts: give 0 to 1$"):
        with_long_rows(TrainConfig(long_prompts=1.5), [], [], _words)


def test_prompts_too_long_for_the_programs_are_left_out_and_none_fitting_is_refused():
    from dflash_et.training.data import fitting

    config, said = TrainConfig(max_seq_len=10, max_new_tokens=4), []
    assert fitting([[1] * 6, [1] * 7, [1] * 2], config, "training", said.append) == [[1] * 6, [1] * 2]
    assert said == ["[train_draft] 1 of 3 training prompts left out: longer than export.max_seq_len=10 leaves room "
                    "for with a 4-token reply"]
    with pytest.raises(ValueError, match=r"^no held-out prompt of train_draft.prompts=builtin fits export.max_seq_len=10 "
                                         r"with a 4-token reply; raise export.max_seq_len or use shorter prompts$"):
        fitting([[1] * 7], config, "held-out", said.append)
