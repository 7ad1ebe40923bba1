"""Prompts a chat target writes itself: the user turn they are sampled in, the filter, seeding, and that no held-out
prompt comes back."""

import json
import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from dflash_et.checkpoints import builtin
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts, load_prompts
from dflash_et.training.synthesize import MIN_CHARS, rejection, synthesize_prompts, user_turn
from tests.tiny_checkpoints import LLAMA_SPECIALS, LLAMA_TEMPLATE

SETTINGS = dict(batch=8, max_new_tokens=48)  # short: the trained target's user messages end within 30 tokens


@pytest.fixture(scope="module")
def target(trained_pair):
    """(model, tokenizer) of the small chat-trained target."""
    model = AutoModelForCausalLM.from_pretrained(trained_pair[0], dtype=torch.float32).eval()
    return model, tokenizer(trained_pair[0])


def key(text: str) -> str:
    return " ".join(text.split()).lower()


@pytest.mark.parametrize("template", ["builtin", "llama"])
def test_user_turn_opens_a_user_message_and_ends_it_as_the_template_does(trained_pair, template):
    tok = (tokenizer(trained_pair[0]) if template == "builtin" else
           builtin.build_tokenizer(LLAMA_SPECIALS, "<|eot_id|>", "<|end_of_text|>", LLAMA_TEMPLATE, vocab_size=600))
    opening, end = user_turn(tok)
    for message in ("x", "How do I keep basil alive?"):
        ids, own = encode_chat(tok, message), tok.encode(message, add_special_tokens=False)
        assert ids[:len(opening)] == opening
        assert ids[len(opening):len(opening) + len(own)] == own
        assert ids[len(opening) + len(own)] == end[0]
    assert tok.convert_ids_to_tokens(end) == [{"builtin": "<|im_end|>", "llama": "<|eot_id|>"}[template]]


def test_a_tokenizer_without_a_chat_template_synthesizes_nothing(trained_pair, target, tmp_path):
    plain = shutil.copytree(trained_pair[0], tmp_path / "target")
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    tok = tokenizer(plain)
    assert tok.chat_template is None
    assert user_turn(tok) is None
    assert synthesize_prompts(target[0], tok, 4, seed=0, **SETTINGS) == []


def test_rejection_says_why_a_message_is_not_kept(target):
    tok = target[1]

    def why(text: str) -> str | None:
        return rejection(tok.encode(text, add_special_tokens=False), text.strip())

    assert why("") == "empty" and why(" \n ") == "empty"
    assert why("Hi there") == "short" and len("Hi there") < MIN_CHARS
    assert why("Tell me about about about about about about about it.") == "repetitive"
    assert why("How many apples does Ben have? How many apples does Ben have?") == "repetitive"
    assert why("What is DNS?") is None
    turn = tok.convert_tokens_to_ids("<|im_start|>")  # the target opening another turn inside its message
    ids = tok.encode("What is DNS?", add_special_tokens=False)
    assert rejection([*ids, turn, *ids], "What is DNS?What is DNS?", special={turn}) == "special"
    assert rejection(ids, "What is DNS?", special={turn}) is None
    assert why("Can you give me a tip about baking bread? I keep burning the crust.") is None


def test_the_projects_own_prompts_pass_the_filter(target):
    """Thresholds loose enough for real questions: long texts to summarize and code in a small vocabulary."""
    tok = target[1]
    rows = load_prompts("assistant", 2000, split="train") + builtin_prompts(100, split="train")
    texts = [r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][0]["content"] for r in rows]
    assert [t for t in texts if rejection(tok.encode(t.strip(), add_special_tokens=False), t.strip())] == []


def test_synthesized_prompts_are_seeded_clean_and_never_held_out(target):
    model, tok = target
    logs = []
    first = [r["prompt"] for r in synthesize_prompts(model, tok, 24, seed=0, log=logs.append, **SETTINGS)]
    torch.rand(7)  # the global RNG moved on: the prompts must not depend on it
    again = [r["prompt"] for r in synthesize_prompts(model, tok, 24, seed=0, log=logs.append, **SETTINGS)]
    other = [r["prompt"] for r in synthesize_prompts(model, tok, 24, seed=1, log=logs.append, **SETTINGS)]
    assert len(first) == 24 and first == again and other != first
    # each sample is drawn from the seed and its index alone: decoding 3 at a time writes the same prompts
    assert [r["prompt"] for r in synthesize_prompts(model, tok, 24, seed=0, batch=3, max_new_tokens=48)] == first
    assert all(p and p == p.strip() for p in first + other)
    assert len({key(p) for p in first}) == len(first) and len({key(p) for p in other}) == len(other)
    assert len(logs) == 3 and logs[0].startswith("[train_draft] synthesized 24 prompts from ")

    held = {first[0], first[3], first[10]}
    exclude = [f"  {p.upper()}\n" for p in held]  # as the held-out rows may differ: case and spacing
    rows = synthesize_prompts(model, tok, 24, seed=0, exclude=exclude, log=logs.append, **SETTINGS)
    third = [r["prompt"] for r in rows]
    assert {r["category"] for r in rows} == {"synthetic"}
    assert not {key(p) for p in third} & {key(p) for p in held}
    assert third[:21] == [p for p in first if p not in held]  # the same samples, less the held-out ones
    assert int(re.search(r"held-out (\d+)", logs[-1])[1]) >= 3  # more: later samples that repeat them


def test_a_target_that_never_ends_its_message_stops_after_a_bounded_number_of_samples(target):
    model, tok = target
    logs = []
    assert synthesize_prompts(model, tok, 8, seed=0, batch=4, max_new_tokens=1, log=logs.append) == []
    assert logs[0].startswith("[train_draft] synthesized 0 prompts from 28 samples (dropped: truncated 28) in ")


def test_training_mixes_them_in_leaves_out_measured_ones_and_falls_back_without_a_template(trained_pair, target,
                                                                                          tmp_path):
    """What training asks for with train_draft.synthetic_prompts: the set's train split plus the prompts the target
    wrote, none of them one validate or bench measures (the built-in set's eval split is every prompt whose text
    hashes there: corpus.split_of); a target without a chat template trains on the set alone, in one logged line."""
    from dflash_et.data.corpus import split_of
    from dflash_et.training.collect import prompt_rows
    from dflash_et.training.config import TrainConfig

    model, tok = target
    config = TrainConfig(num_prompts=6, heldout=2, synthetic_prompts=40, generate_batch=8, max_seq_len=256)
    logs = []
    heldout, train, counts = prompt_rows(config, tok, model, logs.append)
    written = [r["prompt"] for r in train if r["category"] == "synthetic"]
    assert counts == {"set": 6, "synthetic": len(written), "heldout": 2, "synthetic_examples": written[:5]}
    assert len(train) == 6 + len(written)
    assert written and not [p for p in written if split_of(p) == "eval"]
    left_out = re.search(r"(\d+) prompts the target wrote are measured prompts", " ".join(logs))
    assert left_out and len(written) + int(left_out[1]) == 40  # the target writes corpus prompts: some are measured

    plain = shutil.copytree(trained_pair[0], tmp_path / "plain")
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    logs = []
    _, train, counts = prompt_rows(config, tokenizer(plain), model, logs.append)
    assert counts["synthetic"] == 0 and len(train) == 6
    assert logs == ["[train_draft] the target has no chat template to write its own prompts with: training on "
                    "train_draft.prompts=builtin alone"]


def test_a_deadline_stops_the_batches_after_the_first(target):
    """train_draft.minutes: no sample or reply starts past the deadline once the first batch has (which always
    runs), and the replies answered are each the reply it would be without a deadline."""
    from dflash_et.training.data import target_sequences

    model, tok = target
    logs = []
    rows = synthesize_prompts(model, tok, 24, seed=0, deadline=0.0, log=logs.append, **SETTINGS)
    assert 0 < len(rows) <= SETTINGS["batch"] and f" from {SETTINGS['batch']} samples " in logs[0]
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in synthesize_prompts(model, tok, 24, seed=0, **SETTINGS)][
        :len(rows)]
    prompts = [encode_chat(tok, r["prompt"]) for r in builtin_prompts(6, split="train")]
    said, eos = [], {tok.convert_tokens_to_ids("<|im_end|>")}
    cut = target_sequences(model, [1], prompts, 8, eos, batch=2, deadline=0.0, log=said.append)
    whole = target_sequences(model, [1], prompts, 8, eos, batch=2)
    assert len(cut) == 2 and said == ["[train_draft] replies to 2 of 6 prompts: the clock (train_draft.minutes) "
                                      "leaves the rest of the run to training"]
    answered = [next(s for s in whole if s.tokens.equal(c.tokens)) for c in cut]
    assert all(a.taps.equal(c.taps) for a, c in zip(answered, cut))
