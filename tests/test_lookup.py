"""Lookup proposals (runner/host/lookup.h through the host library): what they propose, and decoding with them as
exact as plain decoding, greedy (the built-in target) and sampled (a toy target, against its exact law)."""

import itertools
import json
from collections import Counter

import pytest
import torch

from dflash_et.evaluate.same_distribution import chi_square
from dflash_et.runtime.adaptive import auto_planner, lookup_planner
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.generate import Generation, generate_ar, generate_dflash
from dflash_et.runtime.native import lookup
from dflash_et.runtime.sampling import Sampler, Sampling, distribution
from tests.test_generate import MAX_SEQ_LEN, ar, encode, models, prompts  # noqa: F401 (fixtures)


@pytest.mark.parametrize("context, most, proposed, ngram", [
    ([1, 2, 3, 4, 5, 1, 2], 4, [3, 4, 5, 1], 2),          # what followed the suffix [1, 2] before
    ([1, 2, 3, 4, 5, 1, 2], 2, [3, 4], 2),                # at most `most`
    ([9, 1, 2, 7, 5, 1, 2, 8, 0, 1, 2], 3, [8, 0, 1], 2),  # the latest occurrence
    ([4, 1, 2, 9, 5, 7, 1, 2, 3, 4, 1, 2], 2, [9, 5], 3),  # the longest recurring suffix [4, 1, 2], not [1, 2]
    ([1, 2, 3, 1, 2], 8, [3, 1, 2], 2),                   # it runs to the context's end, no further
    ([5, 5, 5], 4, [5], 2),                               # an occurrence overlapping the suffix
    ([1, 2, 3, 4, 2], 4, [], 0),                          # a lone recurring token proposes nothing
    ([4], 4, [], 0), ([], 4, [], 0), ([1, 2, 1, 2], 0, [], 0),
])
def test_lookup_proposes_what_followed_the_longest_recurring_suffix(context, most, proposed, ngram):
    assert lookup(context, most) == (proposed, ngram)


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


def test_one_token_prompt(models):
    assert lookup_decode(models, [7], 8).tokens == ar(models, [7]).tokens


def scripted(sequence: list[int]):
    """A target whose greedy token after position p is sequence[p + 1], whatever came before."""
    def target(tokens: torch.Tensor, input_pos: torch.Tensor):
        logits = torch.zeros(1, len(input_pos), 32)
        logits[0, torch.arange(len(input_pos)), torch.tensor([sequence[p + 1] for p in input_pos.tolist()])] = 10.0
        return logits, torch.zeros(1, len(input_pos), 1)
    return target


def planned_lookup(sequence: list[int], slope: float, n: int = 400) -> tuple[Generation, float]:
    """Greedy lookup at auto over `sequence` on a curve where a target call costs 1 ms + `slope` per extra token:
    the generation and its speed against plain decoding's by that curve."""
    costs = [1 + slope * t for t in range(16)]
    planner = lookup_planner(CostCurve([0, 1000], [costs, costs], [[0.3] * 15] * 2), 16)
    target, prompt = scripted(sequence), sequence[:10]
    out = generate_dflash(target, None, prompt, n, set(), 1024, 16, 16, 0, lookup_planner=planner)
    assert out.tokens == generate_ar(target, prompt, n, set(), 1024, 16).tokens == sequence[10:10 + n]
    return out, (len(out.tokens) - 1) / sum(1 + slope * r.verified for r in out.rounds)


def test_auto_verifies_the_lookup_proposals_that_pay_on_the_cost_curve():
    """Text of 4 tokens at random: every round finds a recurring suffix, and 1 in 4 of its proposals is right. Where a
    verified token costs 0.3 of a call, verifying them does not pay, and auto learns to decline them (plain steps, with
    a probe now and then): no slower than plain decoding. Where it costs 0.02, verifying one or two pays, and it does.
    Text that repeats itself (a cycle of 9 tokens) after the random stretch: it verifies all the cycle holds again."""
    noise = [int(t) for t in torch.randint(0, 4, (1000,), generator=torch.Generator().manual_seed(0))]
    (dear, dear_speed), (cheap, cheap_speed) = planned_lookup(noise, 0.3), planned_lookup(noise, 0.02)
    assert all(r.drafted > 0 for r in dear.rounds[100:-1])  # proposals are made in every round
    assert sum(r.verified > 0 for r in dear.rounds[100:]) < 0.3 * len(dear.rounds[100:]) and dear_speed > 0.97
    assert all(r.verified > 0 for r in cheap.rounds[100:-1]) and cheap_speed > 1.15
    cycle = noise[:200] + [10 + i % 9 for i in range(800)]
    for slope in (0.3, 0.02):
        out, speed = planned_lookup(cycle, slope)
        assert all(r.verified == r.accepted == r.drafted == 9 for r in out.rounds[-15:-1]) and speed > 1.3


class GuessingDraft:
    """A draft over `sequence` (the `scripted` target's): sure of sequence[p] at each position p where `right(p)`,
    of a wrong token elsewhere."""

    def __init__(self, sequence: list[int], right):
        self.sequence, self.right = sequence, right

    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        start = int(input_pos[-1]) + 1  # the anchor's position; proposal i is position start + 1 + i
        logits = torch.zeros(1, tokens.shape[1] - 1, 32)
        for i in range(tokens.shape[1] - 1):
            p = start + 1 + i
            logits[0, i, self.sequence[p] if self.right(p) else (self.sequence[p] + 1) % 32] = 8.0
        return logits


def test_auto_with_a_draft_gives_lookup_the_rounds_where_it_pays_more():
    """A reply that repeats a 9-token cycle while the draft is wrong, then goes on at random (no run recurs) while the
    draft is right: auto takes lookup's proposals in the cycle and the draft's after it, emitting plain decoding's
    tokens, and beats either alone."""
    g = torch.Generator().manual_seed(1)
    sequence = [10 + i % 9 for i in range(300)] + [int(t) for t in torch.randint(0, 32, (700,), generator=g)]
    draft, costs = GuessingDraft(sequence, right=lambda p: p >= 300), [1 + 0.1 * t for t in range(16)]
    curve = CostCurve([0, 1000], [costs, costs], [[0.3 + 0.02 * b for b in range(2, 17)]] * 2)
    target, prompt = scripted(sequence), sequence[:20]

    def decoded(planner=None, lookups=None, lookup_only=False) -> tuple[Generation, float]:
        out = generate_dflash(target, None if lookup_only else draft, prompt, 560, set(), 1024, 16, 16, 0,
                              planner=planner, lookup_planner=lookups)
        assert out.tokens == sequence[20:580]
        return out, sum(1 + 0.1 * r.verified + (0.3 + 0.02 * (r.drafted + 1)) * (r.drafted > 0 and not r.looked_up)
                        for r in out.rounds)  # ms on the curve

    both, both_ms = decoded(auto_planner(curve, 16, time_weight=0.0), lookup_planner(curve, 16))
    assert sum(r.looked_up and r.accepted >= 8 for r in both.rounds[:20]) >= 15  # in the cycle
    assert not any(r.looked_up for r in both.rounds[-15:]) and sum(r.accepted for r in both.rounds[-15:]) > 150
    _, draft_ms = decoded(auto_planner(curve, 16, time_weight=0.0))
    _, lookup_ms = decoded(lookups=lookup_planner(curve, 16), lookup_only=True)
    assert both_ms < 0.9 * min(draft_ms, lookup_ms)


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
    """`dflash generate --lookup`: the programs' target alone with lookup proposals (auto, or a fixed block), greedy:
    plain decoding's text; --ar with it is one line."""
    from dflash_et import cli

    def generated(*flags: str) -> dict:
        cli.main(["generate", "--prompt", "Say it again: red, green, blue, red, green, blue.", "--programs",
                  str(programs), "--max-new-tokens", "32", "--json", *flags])
        return json.loads(capsys.readouterr().out)

    assert generated("--lookup")["tokens"] == generated("--ar")["tokens"] == generated("--lookup", "--block-size",
                                                                                     "3")["tokens"]
    with pytest.raises(SystemExit, match="^error: --ar and --lookup are two ways to decode; give one"):
        generated("--lookup", "--ar")
