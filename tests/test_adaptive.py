"""block_size: auto, on a scripted target and draft with a constructed cost curve: the planner's choices
are functions of the curve and the draft's confidence, so every decision here is deterministic."""

import numpy as np
import pytest
import torch

from dflash_et.errors import UserError
from dflash_et.runtime import adaptive, cost_curve
from dflash_et.runtime.adaptive import AdaptivePlanner, Calibration, expected_tokens
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.cost_curve import confidence as adaptive_confidence
from dflash_et.runtime.generate import generate_ar, generate_dflash

V, H, MASK = 64, 4, 63
TRUTH = [int(x) for x in torch.randint(0, MASK, (600,), generator=torch.Generator().manual_seed(0))]


def curve(target_slope: float = 0.1, max_block: int = 16, target: list[float] | None = None) -> CostCurve:
    """A target call costs 1 ms + `target_slope` per extra token (or `target`[T - 1]); a draft call 0.3 ms +
    0.02 per block token."""
    target = target or [1 + target_slope * t for t in range(max_block)]
    draft = [0.3 + 0.02 * b for b in range(2, max_block + 1)]
    return CostCurve([0, 1000], [target, target], [draft, draft])


def target(tokens: torch.Tensor, input_pos: torch.Tensor):
    """Greedy continues TRUTH: the token after position p is TRUTH[p + 1], whatever came before."""
    logits = torch.zeros(1, len(input_pos), V)
    logits[0, torch.arange(len(input_pos)), torch.tensor([TRUTH[p + 1] for p in input_pos.tolist()])] = 10.0
    return logits, torch.zeros(1, len(input_pos), H)


class ScriptedDraft:
    """Proposes TRUTH where `right(position)` says so and a wrong token elsewhere, `confidence(i)` sure of its
    i-th proposal (i = 0..); counts its calls by position."""

    def __init__(self, right=lambda p: True, confidence=lambda i: 0.97):
        self.right, self.confidence, self.calls = right, confidence, []

    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        start = int(input_pos[-1]) + 1  # the block's anchor sits here; proposal i predicts position start + 1 + i
        self.calls.append(start)
        logits = torch.zeros(1, tokens.shape[1] - 1, V)
        for i in range(tokens.shape[1] - 1):
            p = start + 1 + i
            want = TRUTH[p] if self.right(p) else (TRUTH[p] + 1) % MASK
            c = self.confidence(i)  # softmax of one logit h over V - 1 zeros: c = e^h / (e^h + V - 1)
            logits[0, i, want] = float(np.log(c * (V - 1) / (1 - c)))
        return logits


def by_curve(curve: CostCurve, max_block: int = 16) -> AdaptivePlanner:
    """Deciding by the curve alone (the scripted calls' own wall times are not what the curve describes)."""
    return AdaptivePlanner(curve, max_block, time_weight=0.0)


def run(draft, planner, n=400, prompt=TRUTH[:10]):
    out = generate_dflash(target, draft, prompt, n, set(), 1024, 16, planner.max_block, MASK, planner=planner)
    assert out.tokens == generate_ar(target, prompt, n, set(), 1024, 16).tokens == TRUTH[10:10 + n]
    return out


def test_expected_tokens():
    assert expected_tokens([0.5, 0.5]) == [1.0, 1.5, 1.75]
    assert expected_tokens([1.0, 0.0, 1.0]) == [1.0, 2.0, 2.0, 2.0]


def test_calibration_learns_what_the_target_accepts():
    c = Calibration()
    assert c([0.95, 0.05]) == pytest.approx([0.95, 0.05])  # the prior: a calibrated draft
    for _ in range(50):  # sure of its first proposal and always wrong; the second never put to the test
        c.observe([0.95, 0.15], accepted=0)
    assert c([0.95])[0] < 0.1 and c([0.15])[0] == pytest.approx(0.15)
    for _ in range(40):  # then right: within tens of rounds it believes the draft again
        c.observe([0.95, 0.95, 0.95], accepted=3)
    assert c([0.95])[0] > 0.9


def test_a_good_draft_gets_long_blocks_and_the_cost_curve_cuts_them():
    flat = run(ScriptedDraft(), by_curve(curve(0.02)))
    assert np.mean([r.verified for r in flat.rounds[5:]]) > 12 and flat.tau > 10
    step = run(ScriptedDraft(), by_curve(curve(target=[1, 1.1, 1.2, 1.3] + [9] * 12)))
    assert {r.verified for r in step.rounds[:-1]} == {3} and {r.drafted for r in step.rounds[5:-1]} == {3}


def test_unsure_proposals_are_not_verified():
    """Sure of its first three proposals, a coin flip on the rest: verify the three (the curve charges 0.1 a token)."""
    out = run(ScriptedDraft(confidence=lambda i: 0.97 if i < 3 else 0.12), by_curve(curve(0.3)))
    assert [r.verified for r in out.rounds[10:]] == [3] * len(out.rounds[10:-1]) + [out.rounds[-1].verified]


def test_falls_back_to_plain_steps_and_probes_with_doubling_gaps():
    """Right until position 100, confidently wrong from 100 to 400, right again after: auto stops drafting
    once the window of rounds says it does not pay (at most 32 rounds), probes the draft after 2, 4, .. 32
    plain steps, and drafts again once it is right."""
    draft = ScriptedDraft(right=lambda p: not 100 <= p < 400)
    planner = by_curve(curve(0.1))
    out = run(draft, planner, n=560)
    bad = [c for c in draft.calls if 100 <= c < 400]
    gaps = np.diff(bad).tolist()
    entry = gaps.index(3)  # rounds drafted into the bad stretch before the first plain steps
    assert 4 < entry <= 32 and set(gaps[:entry]) == {1}
    assert gaps[entry:entry + 4] == [3, 5, 9, 17] and set(gaps[entry + 4:]) == {33}
    pos, cost, plain = 10, 0.0, 0.0  # what the bad stretch cost after the entry, by the curve, against plain steps
    for r in out.rounds:
        if bad[entry] < pos < 400:
            cost += (planner.curve.draft(r.drafted + 1, pos) if r.drafted else 0) + planner.curve.target(r.verified + 1, pos)
            plain += r.emitted * planner.curve.target(1, pos)
        pos += r.emitted
    assert cost < 1.05 * plain
    late = [r for r, p in zip(out.rounds[:-1], np.cumsum([10] + [r.emitted for r in out.rounds])) if p >= 450]
    assert all(r.drafted for r in late) and np.mean([r.emitted for r in late]) > 8


def test_a_short_bad_stretch_does_not_stop_a_good_draft():
    """Six rounds or more that accept at most one proposal (wrong at 200..207) in a draft right elsewhere:
    the last few rounds say plain steps, the window does not, and auto keeps drafting."""
    out = run(ScriptedDraft(right=lambda p: not 200 <= p < 208), by_curve(curve(0.1)))
    assert sum(r.accepted <= 1 for r in out.rounds) >= 6 and all(r.drafted for r in out.rounds[:-1])


def test_a_draft_wrong_after_long_prompts_stops_being_paid_for_there_alone():
    """Right after short prompts, confidently wrong after long ones (the built-in draft trained on short chats,
    after a document): what auto learned after short prompts keeps it drafting after long ones for one round
    (the last code drafted 8 before its first plain step, 28% dearer than plain decoding), and what it learns
    after long ones does not stop it drafting after short ones (bands of context)."""
    planner = by_curve(curve(0.1))
    draft = ScriptedDraft(right=lambda p: p < 290)

    def generate(prompt: int, n: int) -> tuple[list, float]:  # the rounds, and their cost by the curve over plain steps
        out = generate_dflash(target, draft, TRUTH[:prompt], n, set(), 1024, 16, 16, MASK, planner=planner)
        assert out.tokens == TRUTH[prompt:prompt + n]
        pos, cost, plain = prompt, 0.0, 0.0
        for r in out.rounds:
            cost += (planner.curve.draft(r.drafted + 1, pos) if r.drafted else 0) + planner.curve.target(r.verified + 1, pos)
            plain += r.emitted * planner.curve.target(1, pos)
            pos += r.emitted
        return out.rounds, cost / plain

    for _ in range(10):
        generate(10, 40)
    first, *rest = [generate(prompt, 60) for prompt in (300, 340, 380, 420, 500)]
    entry = next(i for i, r in enumerate(first[0]) if not r.drafted)  # rounds drafted before the first plain step
    assert entry <= 3 and first[1] < 1.12  # the band's first round replaced what short prompts had earned
    assert all(sum(r.drafted > 0 for r in rounds) <= 3 and cost < 1.03 for rounds, cost in rest)  # then probes
    rounds, cost = generate(10, 40)
    assert rounds[0].drafted == 15 and all(r.drafted for r in rounds) and cost < 0.4


def test_a_round_that_ends_its_generation_counts_no_tokens_past_its_end():
    """Replies of 6 tokens, one round each (a block of 5 fits what is left): a longer block would have
    emitted nothing more, so the openings' window credits none (extrapolating would favour blocks of 16)."""
    planner = by_curve(curve(0.1))
    for _ in range(40):
        out = generate_dflash(target, ScriptedDraft(), TRUTH[:10], 6, set(), 1024, 16, 16, MASK, planner=planner)
        assert out.tokens == TRUTH[10:16] and len(out.rounds) == 1
    assert planner.band.openings.total[15] == pytest.approx(planner.band.openings.total[4]) == 32 * 5


def test_openings_choose_their_block_from_their_own_window():
    """Replies whose first round is all right (positions 11-25) and whose later rounds are right at two
    positions in three: openings draft the largest block, later rounds a short one."""
    planner = by_curve(curve(0.1))
    draft = ScriptedDraft(right=lambda p: p < 26 or p % 3 != 0)
    for _ in range(40):
        out = generate_dflash(target, draft, TRUTH[:10], 40, set(), 1024, 16, 16, MASK, planner=planner)
        assert out.tokens == TRUTH[10:50]
    assert out.rounds[0].drafted == 15 and out.rounds[0].accepted == out.rounds[0].verified  # k: by confidence
    assert all(1 <= r.drafted <= 4 for r in out.rounds[1:-1])


def test_probes_reset_when_the_draft_is_sure_again():
    planner = by_curve(curve(0.1))
    for _ in range(32):  # recent rounds: useless
        planner.band.later.add(expected_tokens([0.01] * 15))
    blocks = [planner.block(100, 16) for _ in range(4)]
    assert blocks[0] > 1 and blocks[1:3] == [1, 1] and blocks[3] > 1  # a probe, two plain steps, a probe
    sure = torch.full((blocks[3] - 1, V), -10.0)
    sure[:, 0] = 10.0
    k = planner.verify_count(sure, 100)
    planner.observe(k, accepted=0, seconds=0.0)  # a probe that failed: the next plain stretch is twice as long
    assert k > 0 and (planner.band.plain_left, planner.band.probe_gap) == (4, 8)
    assert [planner.block(100, 16) for _ in range(5)][4] > 1  # four plain steps, then a probe
    k = planner.verify_count(sure, 100)
    planner.observe(k, accepted=k, seconds=0.0)  # one that paid: draft again at once
    assert (planner.band.plain_left, planner.band.probe_gap) == (0, 2) and planner.block(100, 16) > 1


def test_a_probe_dearer_than_plain_steps_buys_a_longer_plain_stretch():
    """A probe that took 5 plain steps' time to emit one token (its draft read a long prompt first) is followed by
    three to four times the plain steps one that took 2 is: probing a draft that never accepts costs the same share
    of decoding's time however dear its probes are. Wall times price it (learning them), or the curve (not)."""
    stretches = []
    for ms, time_weight in ((2.0, 0.05), (5.0, 0.05), (5.0, 0.0)):
        planner = AdaptivePlanner(curve(0.1), 16, time_weight=time_weight)
        for _ in range(32):  # recent rounds: useless
            planner.band.later.add(expected_tokens([0.01] * 15))
        assert planner.block(100, 16) > 1 and planner._probing
        planner.observe(planner.verify_count(torch.zeros(15, V), 100), accepted=0, seconds=ms / 1000)
        blocks = [planner.block(101 + i, 16) for i in range(20)]
        stretches.append(blocks.index(next(b for b in blocks if b > 1)))
    assert stretches[0] == stretches[2] == 2 and 3 * 2 <= stretches[1] <= 4 * 2


def test_confidence_is_read_only_while_choosing_k_pays_for_it(monkeypatch):
    """Reading the draft's confidence costs host time: a draft whose proposals are all worth verifying
    (choosing k saves nothing) is read on every 8th round only; one where k matters, on most rounds."""
    reads = []
    monkeypatch.setattr(adaptive, "confidence", lambda logits: reads.append(1) or adaptive_confidence(logits))
    c = curve(0.02)
    c.confidence_ms = 0.05
    share = []
    for draft in (ScriptedDraft(), ScriptedDraft(confidence=lambda i: 0.97 if i < 3 else 0.12)):
        reads.clear()
        out = run(draft, by_curve(c))
        share.append(len(reads) / sum(1 for r in out.rounds if r.drafted))
    assert 1 / 8 <= share[0] < 0.2 and share[1] > 0.5


def test_cost_curve_file_round_trip_and_errors(tmp_path):
    c = curve()
    c.programs = "these"
    (tmp_path / "c.json").write_text(__import__("json").dumps(c.to_dict()))
    assert CostCurve.load(tmp_path / "c.json", "these") == c
    assert c.target(2, 500) == pytest.approx(1.1) and c.draft(16, 0) == pytest.approx(0.62)
    with pytest.raises(UserError, match="measured on other programs than these; rerun the bench stage"):
        CostCurve.load(tmp_path / "c.json", "others")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="is not a cost curve"):
        CostCurve.load(tmp_path / "bad.json", "these")


def test_what_rounds_cost_beyond_the_curve_is_learned_per_call():
    """Rounds that take 2 ms a call longer than the curve says (host work, cold caches) make plain steps and
    drafting compare at their real cost."""
    p = AdaptivePlanner(curve(0.1), 16)
    for _ in range(200):
        b, k = p.block(100, 16), 0
        if b > 1:
            k = p.verify_count(torch.zeros(b - 1, V), 100)  # unsure: verifies few or none
        target, draft = p._cost(100)
        p.observe(k, 0, seconds=(draft[b - 1] + target[k] + 2.0 * (1 + (b > 1))) / 1000)
    assert p.per_call == pytest.approx(2.0, rel=1e-3)



def test_the_cost_curve_times_decoding_rounds_of_every_block():
    """measure_cost_curve runs real decoding rounds (generate_dflash): per sweep, three rounds of each block,
    in descending and ascending order by turns (so that each block is timed at the same mean position),
    every proposal verified, one position further each round, never past the cache; a curve per position
    with a value per block."""
    calls = []

    def timed_target(tokens, input_pos):
        calls.append((tokens.shape[1], int(input_pos[0])))
        return target(tokens, input_pos)

    draft = ScriptedDraft(right=lambda p: False)  # wrong everywhere: a sweep must not depend on acceptance
    c = cost_curve.measure_cost_curve(timed_target, draft, 8, 200, MASK, 16, repeats=2)
    assert len(c.positions) == 3 and all(len(row) == 8 for row in c.target_ms) and all(len(row) == 7 for row in c.draft_ms)
    assert all(p + t <= 200 for t, p in calls) and 0 < c.confidence_ms
    lengths = "".join(str(t) if t < 10 else "|" for t, _ in calls)  # prefill chunks of 16 read as |
    descending, ascending = "".join(str(b) * 3 for b in range(8, 0, -1)), "".join(str(b) * 3 for b in range(1, 9))
    assert lengths.count(descending) == 3 and lengths.endswith(ascending + "1" * 8)  # 3 positions x 1 descending sweep
    positions = [p for t, p in calls][-32:]
    assert positions == list(range(positions[0], positions[0] + 32)) and positions[-1] == 199
    calls.clear()  # a cache too small for three rounds of each block: one each, still inside it
    small = cost_curve.measure_cost_curve(timed_target, draft, 8, 10, MASK, 16, repeats=1)
    assert all(p + t <= 10 for t, p in calls) and [t for t, _ in calls][-8:] == list(range(8, 0, -1))
    assert all(len(row) == 8 and all(x > 0 for x in row) for row in small.target_ms)
    # sweeps from chosen positions (docs/measurements.md's cost deep into the cache), each reported at its mean; the
    # end of the cache is kept
    chosen = cost_curve.measure_cost_curve(timed_target, draft, 8, 200, MASK, 16, repeats=1, starts=[100, 20])
    assert chosen.positions == [20 + 12, 100 + 12] and len(chosen.draft_ms) == 2
    with pytest.raises(UserError, match=r"cost curve sweeps start at 1..168 in a cache of 200, not at \[20, 170\]"):
        cost_curve.measure_cost_curve(timed_target, draft, 8, 200, MASK, 16, repeats=1, starts=[20, 170])
