"""Sampling: the processed distributions, and the speculative-sampling rule proved exact by enumeration.

A toy target over a small vocabulary gives a distribution for every prefix; a round verifies
proposals with the target's distributions after each proposal prefix, as a verify call does. The
distribution of a round's output, computed exactly by enumerating every proposal and every
accept/reject outcome, continued by plain sampling to a fixed length, must equal the target's own
distribution over sequences of that length.
"""

import itertools
from collections import Counter

import pytest
import torch

from dflash_et.evaluate.same_distribution import chi_square, goodness_of_fit, p_value, total_variation
from dflash_et.runtime.sampling import Sampler, Sampling, acceptance, distribution, nucleus, residual

V, N = 5, 2  # vocabulary, proposals per round (block 3)
SETTINGS = [Sampling(1.0), Sampling(0.8, top_k=3), Sampling(0.7, top_p=0.8), Sampling(1.3, top_p=0.9, top_k=4)]


def toy_target(seed: int):
    """Logits [V] for the token after each prefix: a fixed random function of the prefix."""
    def logits(prefix: tuple) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1000 + hash(prefix) % 997)
        return 2 * torch.randn(V, generator=g)
    return logits


def draft_logits(seed: int, target) -> torch.Tensor:
    """The draft's logits [N, V] for one block: independent of its own proposals, as DFlash's draft is, and
    close to the target's along its greedy path (plus noise), so that proposals are accepted only sometimes."""
    path, rows = (), []
    for _ in range(N):
        rows.append(target(path))
        path += (int(rows[-1].argmax()),)
    return torch.stack(rows) + torch.randn(N, V, generator=torch.Generator().manual_seed(seed + 7))


def round_distribution(target, draft: torch.Tensor, s: Sampling, accept=acceptance) -> dict[tuple, float]:
    """Exact distribution of one round's emitted tokens, by enumeration over proposals and outcomes."""
    out: dict[tuple, float] = Counter()
    n = len(draft)
    if s.proposals == "sample":
        q = distribution(draft, s).double()
        proposal_sets = [(xs, float(torch.prod(q[torch.arange(n), list(xs)])))
                         for xs in itertools.product(range(V), repeat=n)]
    else:
        q, proposal_sets = None, [(tuple(draft.argmax(-1).tolist()), 1.0)]
    for xs, weight in proposal_sets:
        reach = weight
        for i, x in enumerate(xs):
            p = distribution(target(xs[:i]), s)
            q_i = None if q is None else q[i].float()
            a = accept(p, q_i, x)
            rejected = residual(p, q_i, x)
            for y in range(V):
                out[xs[:i] + (y,)] += reach * (1 - a) * float(rejected[y])
            reach *= a
        p = distribution(target(xs), s)
        for y in range(V):
            out[xs + (y,)] += reach * float(p[y])
    return out


def target_sequence_probability(target, seq: tuple, s: Sampling, given: int = 0) -> float:
    prob = 1.0
    for j in range(given, len(seq)):
        prob *= float(distribution(target(seq[:j]), s)[seq[j]])
    return prob


def max_error_against_target(target, rounds: dict[tuple, float], s: Sampling) -> float:
    """Largest difference, over all sequences of N+1 tokens, between (one round, then plain sampling) and
    plain sampling alone."""
    worst = 0.0
    for seq in itertools.product(range(V), repeat=N + 1):
        via_round = sum(prob * target_sequence_probability(target, seq, s, given=len(prefix))
                        for prefix, prob in rounds.items() if seq[:len(prefix)] == prefix)
        worst = max(worst, abs(via_round - target_sequence_probability(target, seq, s)))
    return worst


@pytest.mark.parametrize("proposals", ["argmax", "sample"])
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"t{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_one_round_has_exactly_the_target_distribution(s, proposals):
    s = Sampling(s.temperature, s.top_p, s.top_k, proposals)
    for seed in range(3):
        target = toy_target(seed)
        draft = draft_logits(seed, target)
        rounds = round_distribution(target, draft, s)
        assert abs(sum(rounds.values()) - 1) < 1e-6
        assert max_error_against_target(target, rounds, s) < 1e-6


@pytest.mark.parametrize("proposals", ["argmax", "sample"])
def test_verifying_any_prefix_of_the_proposals_is_exact(proposals):
    """block_size: auto verifies the first k proposals, k chosen from the draft's probabilities (not from what it
    sampled): a round verifying any k, 0 (a plain step) included, keeps exactly the target's distribution."""
    s = Sampling(0.9, top_k=4, proposals=proposals)
    target = toy_target(2)
    draft = draft_logits(2, target)
    for k in range(N + 1):
        rounds = round_distribution(target, draft[:k], s)
        assert abs(sum(rounds.values()) - 1) < 1e-6 and max_error_against_target(target, rounds, s) < 1e-6


def test_the_enumeration_catches_a_wrong_rule():
    """Accepting every proposal (in either mode the output then follows the draft), or the argmax rule applied
    to sampled proposals, is not exact: the enumeration can fail."""
    target = toy_target(0)
    draft = draft_logits(0, target)
    for proposals in ("sample", "argmax"):
        s = Sampling(1.0, proposals=proposals)
        always = round_distribution(target, draft, s, accept=lambda p, q, x: 1.0)
        assert max_error_against_target(target, always, s) > 0.01
    s = Sampling(1.0, proposals="sample")
    argmax_rule = round_distribution(target, draft, s, accept=lambda p, q, x: float(p[x]))
    assert max_error_against_target(target, argmax_rule, s) > 0.01


@pytest.mark.parametrize("proposals", ["argmax", "sample"])
def test_sampler_rounds_follow_the_enumerated_distribution(proposals):
    """The Sampler's own propose/verify loop, run 20000 times with a fixed seed, against the exact distribution."""
    s = Sampling(0.9, top_p=0.95, top_k=4, proposals=proposals, seed=1)
    target = toy_target(1)
    draft = draft_logits(1, target)
    exact = round_distribution(target, draft, s)
    sampler, seen = Sampler(s), Counter()
    for _ in range(20000):
        xs, q = sampler.propose(draft)
        logits = torch.stack([target(tuple(xs[:i])) for i in range(N + 1)])
        accepted, following = sampler.verify(xs, q, logits)
        seen[tuple(xs[:accepted]) + (following,)] += 1
    expected = Counter({k: round(v * 1e6) for k, v in exact.items() if v > 0})  # a huge sample of the exact law
    assert set(seen) <= set(expected)
    _, _, p = chi_square(seen, expected)
    assert p > 1e-3 and total_variation(seen, expected) < 0.02


def test_greedy_verify_is_the_longest_matching_prefix():
    sampler = Sampler()
    logits = torch.eye(V)[[3, 1, 4, 0]] * 5  # target argmax after each prefix: 3, 1, 4, then 0
    assert sampler.verify([3, 1, 2], None, logits) == (2, 4)
    assert sampler.verify([3, 1, 4], None, logits) == (3, 0)
    assert sampler.verify([0, 1, 4], None, logits) == (0, 3)
    assert sampler.propose(logits[:3]) == ([3, 1, 4], None)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"t{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_distribution_matches_transformers_warpers(s):
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    warpers = LogitsProcessorList([TemperatureLogitsWarper(s.temperature)]
                                  + ([TopKLogitsWarper(s.top_k)] if s.top_k else [])
                                  + ([TopPLogitsWarper(s.top_p)] if s.top_p < 1 else []))
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    logits[0, :4] = logits[0].max()  # ties at the top: with top_k 3 the slow path (ties kept), with 4 the fast one
    expected = warpers(torch.zeros(6, 1, dtype=torch.long), logits.clone()).softmax(-1)
    torch.testing.assert_close(distribution(logits, s), expected)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_nucleus_grows_its_head_until_it_covers_top_p(top_p):
    """Flat logits over 1000 tokens: the nucleus holds hundreds of tokens, far past a 4-token first head."""
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = 0.3 * torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))
    expected = TopPLogitsWarper(top_p)(torch.zeros(3, 1, dtype=torch.long), logits.clone()).softmax(-1)
    kept = nucleus(logits.softmax(-1), top_p, head=4)
    assert torch.equal(kept > 0, expected > 0) and (kept > 0).sum() > 3 * 16
    torch.testing.assert_close(kept, expected)


def test_residual_and_acceptance_edges():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert acceptance(p, None, 2) == 0.0 and acceptance(torch.tensor([1.0, 0, 0]), None, 0) == 1.0
    torch.testing.assert_close(residual(p, None, 0), torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(residual(p, p.clone(), 0), p)  # p == q: never rejected; no division by zero
    torch.testing.assert_close(residual(p, torch.tensor([1.0, 0, 0]), 0), torch.tensor([0.0, 1.0, 0.0]))


def test_same_seed_same_draws_and_greedy_draws_nothing():
    logits = torch.randn(3, V)
    a, b = Sampler(Sampling(1.0, seed=4)), Sampler(Sampling(1.0, seed=4))
    assert [a.next_token(logits[0]) for _ in range(20)] == [b.next_token(logits[0]) for _ in range(20)]
    greedy = Sampler(Sampling(seed=4))
    assert greedy.next_token(logits[0]) == int(logits[0].argmax())
    assert torch.equal(greedy.generator.get_state(), Sampler(Sampling(seed=4)).generator.get_state())


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=-0.5), "temperature must be 0 (greedy) or a positive number, got -0.5"),
    (dict(temperature=float("nan")), "temperature must be 0 (greedy) or a positive number, got nan"),
    (dict(temperature=float("inf")), "temperature must be 0 (greedy) or a positive number, got inf"),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0; 1 turns top-p off"),
    (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5; 1 turns top-p off"),
    (dict(top_k=0), "top_k must be at least 1, got 0; leave it unset to turn top-k off"),
    (dict(proposals="beam"), "proposals must be one of argmax, sample, got 'beam'"),
])
def test_bad_settings_are_one_line_errors(bad, message):
    with pytest.raises(ValueError) as e:
        Sampling(**{"temperature": 1.0, **bad})
    assert str(e.value) == message


def test_chi_square_pools_rare_tokens_and_detects_a_shift():
    same = chi_square(Counter({0: 500, 1: 300, 2: 200, 3: 2}), Counter({0: 490, 1: 310, 2: 199, 4: 1}))
    assert same[1] == 3 and same[2] > 0.5  # 3 and 4 pooled into one bin: 4 bins
    shifted = chi_square(Counter({0: 550, 1: 250, 2: 200}), Counter({0: 450, 1: 350, 2: 200}))
    assert shifted[2] < 1e-5
    assert chi_square(Counter({7: 10}), Counter({7: 30}))[2] == 1.0



def test_goodness_of_fit_pools_rare_and_excluded_tokens_and_detects_a_shift():
    probs = torch.tensor([0.5, 0.3, 0.196, 0.004, 0.0])
    gen = torch.Generator().manual_seed(0)
    right = Counter(torch.multinomial(probs, 1000, replacement=True, generator=gen).tolist())
    statistic, dof = goodness_of_fit(right, 1000 * probs)
    assert dof == 2 and p_value(statistic, dof) > 1e-2  # token 3 (expected 4) pooled into the smallest bin
    shifted = Counter(torch.multinomial(torch.tensor([0.45, 0.35, 0.196, 0.004, 0.0]), 1000, replacement=True,
                                        generator=gen).tolist())
    assert p_value(*goodness_of_fit(shifted, 1000 * probs)) < 1e-3
    right[4] += 1  # one token the target's top-k excluded (a boundary a rounding moved): pooled, no failure
    assert p_value(*goodness_of_fit(right, 1001 * probs)) > 1e-2
    assert p_value(*goodness_of_fit(Counter({0: 7}), 7 * probs)) == 1.0  # too few to test
    assert total_variation(Counter({0: 5, 1: 5}), torch.tensor([0.5, 0.25, 0.25])) == pytest.approx(0.25)
