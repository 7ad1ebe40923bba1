"""Lookup proposals (runner/host/lookup.h through the host library): what they propose, and decoding with them as
exact as plain decoding, greedy (the built-in target) and sampled (a toy target, against its exact law)."""

import itertools
import json
from collections import Counter

import pytest
import torch

from dflash_et.evaluate.same_distribution import chi_square
from dflash_et.runtime.generate import generate_ar, generate_dflash
from dflash_et.runtime.native import lookup
from dflash_et.runtime.sampling import Sampler, Sampling, distribution
from tests.test_generate import MAX_SEQ_LEN, ar, encode, models, prompts  # noqa: F401 (fixtures)


@pytest.mark.parametrize("context, most, proposed", [
    ([1, 2, 3, 4, 5, 1, 2], 4, [3, 4, 5, 1]),          # what followed the suffix [1, 2] before
    ([1, 2, 3, 4, 5, 1, 2], 2, [3, 4]),                # at most `most`
    ([9, 1, 2, 7, 5, 1, 2, 8, 0, 1, 2], 3, [8, 0, 1]),  # the latest occurrence
    ([4, 1, 2, 9, 5, 7, 1, 2, 3, 4, 1, 2], 2, [9, 5]),  # the longest recurring suffix [4, 1, 2], not [1, 2]
    ([1, 2, 3, 1, 2], 8, [3, 1, 2]),                   # it runs to the context's end, no further
    ([5, 5, 5], 4, [5]),                               # an occurrence overlapping the suffix
    ([1, 2, 3, 4, 2], 4, []),                          # a lone recurring token proposes nothing
    ([4], 4, []), ([], 4, []), ([1, 2, 1, 2], 0, []),
])
def test_lookup_proposes_what_followed_the_longest_recurring_suffix(context, most, proposed):
    assert lookup(context, most) == proposed


def lookup_decode(models, prompt, block, n=24, eos=frozenset(), max_seq_len=MAX_SEQ_LEN, sampler=None):
    return generate_dflash(models[0], None, prompt, n, set(eos), max_seq_len, 16, block, models[2].mask_token_id,
                           sampler=sampler)


@pytest.mark.parametrize("block", [2, 5, 16])
def test_greedy_lookup_decoding_is_plain_decoding(models, prompts, block):
    """Token for token plain greedy decoding, on the built-in target whose replies repeat (so proposals are made
    and accepted: the test checks they were), and after a prompt that is its own reply twice over."""
    accepted = 0
    for ids in encode(prompts)[:4]:
        ref = ar(models, ids, n=40).tokens
        for prompt in (ids, ids + ref[:20] + ids[-3:] + ref[:20]):
            want = ar(models, prompt, n=40).tokens
            out = lookup_decode(models, prompt, block, n=40)
            assert out.tokens == want
            assert sum(r.emitted for r in out.rounds) + 1 == len(out.tokens)
            assert all(type(r.drafted) is int and r.verified == r.drafted <= block - 1 for r in out.rounds)
            accepted += sum(r.accepted for r in out.rounds)
    assert accepted > 0


@pytest.mark.parametrize("room", [0, 1, 2, 5])
def test_lookup_never_writes_past_max_seq_len_nor_past_the_budget(models, room):
    prompt = [5, 6, 7, 8] * 6  # lookup proposes at once, a block's worth
    limit = len(prompt) + room
    assert lookup_decode(models, prompt, 16, n=100, max_seq_len=limit).tokens == ar(models, prompt, 100,
                                                                                    max_seq_len=limit).tokens
    for n in (1, 2, 3):
        assert lookup_decode(models, prompt, 16, n=n).tokens == ar(models, prompt, n).tokens


def test_one_token_prompt_and_the_planner_refused(models):
    assert lookup_decode(models, [7], 8).tokens == ar(models, [7]).tokens
    with pytest.raises(ValueError, match="lookup proposals take a fixed block_size"):
        generate_dflash(models[0], None, [1, 2], 4, set(), MAX_SEQ_LEN, 16, 4, 0, planner=object())


V = 4


class ToyTarget:
    """A target over V tokens with a cache: the logits after a prefix are a fixed function of it, leaning to go on
    with the prompt's cycle (so lookup's proposals are accepted sometimes, rejected sometimes). Calls write their
    tokens at their positions, as a KV cache does, and read only what is written before each row."""

    def __init__(self):
        self.cache: list[int] = []

    @staticmethod
    def logits(prefix: tuple) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(prefix) % 10007)
        row = torch.randn(V, generator=g)
        row[(prefix[-1] + 1) % V] += 1.5
        return row

    def __call__(self, tokens: torch.Tensor, input_pos: torch.Tensor):
        start = int(input_pos[0])
        self.cache[start:] = tokens[0].tolist()
        rows = [self.logits(tuple(self.cache[:start + i + 1])) for i in range(tokens.shape[1])]
        return torch.stack(rows)[None], torch.zeros(1, tokens.shape[1], 1)


def test_sampled_lookup_decoding_has_exactly_the_targets_distribution():
    """4 tokens after a cyclic prompt, 6,000 times with lookup proposals at block 4, against the exact law of
    plain sampling (each sequence's probability, enumerated), by a chi-square test; the same test catches the rule
    applied as if proposals were always right."""
    s, prompt, n = Sampling(0.9, top_k=3, seed=3), [0, 1, 2, 3, 0, 1, 2], 4
    exact = Counter()
    for seq in itertools.product(range(V), repeat=n):
        prob, prefix = 1.0, tuple(prompt)
        for t in seq:
            prob, prefix = prob * float(distribution(ToyTarget.logits(prefix), s)[t]), prefix + (t,)
        if prob > 0:
            exact[seq] = round(prob * 1e6)

    def sampled(accept_all: bool) -> Counter:
        sampler, seen = Sampler(s), Counter()
        if accept_all:
            sampler.verify = lambda proposals, q, logits: (len(proposals), sampler.next_token(logits[len(proposals)]))
        for _ in range(6000):
            out = generate_dflash(ToyTarget(), None, prompt, n, set(), 64, 16, 4, 0, sampler=sampler)
            seen[tuple(out.tokens)] += 1
        return seen

    seen = sampled(accept_all=False)
    assert set(seen) <= set(exact)
    _, _, p = chi_square(seen, exact)
    assert p > 1e-3
    _, _, p_wrong = chi_square(sampled(accept_all=True), exact)
    assert p_wrong < 1e-6


def test_dflash_generate_lookup_prints_plain_decodings_reply(programs, capsys):
    """`dflash generate --lookup`: the programs' target alone with lookup proposals, greedy: plain decoding's text;
    --ar with it, or auto, is one line."""
    from dflash_et import cli

    def generated(*flags: str) -> dict:
        cli.main(["generate", "--prompt", "Say it again: red, green, blue, red, green, blue.", "--programs",
                  str(programs), "--max-new-tokens", "32", "--json", *flags])
        return json.loads(capsys.readouterr().out)

    assert generated("--lookup")["tokens"] == generated("--ar")["tokens"] == generated("--lookup", "--block-size",
                                                                                     "3")["tokens"]
    for flags, message in ((["--lookup", "--ar"], "--ar and --lookup are two ways to decode; give one"),
                           (["--lookup", "--block-size", "auto"], "--lookup takes a fixed --block-size")):
        with pytest.raises(SystemExit, match=f"^error: {message}"):
            generated(*flags)
