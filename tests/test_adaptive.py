"""block_size: auto, on a scripted target and draft with a constructed cost curve: the planner's choices
are functions of the curve and the draft's confidence, so every decision here is deterministic. The planner is the
C++ runner's (runner/host/planner.h, through the host library): these tests see only what it chooses."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from dflash_et.errors import UserError
from dflash_et.runtime import cost_curve
from dflash_et.runtime.adaptive import auto_planner
from dflash_et.runtime.cost_curve import CostCurve
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


def by_curve(curve: CostCurve, max_block: int = 16):
    """Deciding by the curve alone (the scripted calls' own wall times are not what the curve describes)."""
    return auto_planner(curve, max_block, time_weight=0.0)


def run(draft, planner, n=400, prompt=TRUTH[:10]):
    out = generate_dflash(target, draft, prompt, n, set(), 1024, 16, 16, MASK, planner=planner)
    assert out.tokens == generate_ar(target, prompt, n, set(), 1024, 16).tokens == TRUTH[10:10 + n]
    return out


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
    c = curve(0.1)
    planner = by_curve(c)
    out = run(draft, planner, n=560)
    bad = [c for c in draft.calls if 100 <= c < 400]
    gaps = np.diff(bad).tolist()
    entry = gaps.index(3)  # rounds drafted into the bad stretch before the first plain steps
    assert 4 < entry <= 32 and set(gaps[:entry]) == {1}
    assert gaps[entry:entry + 4] == [3, 5, 9, 17] and set(gaps[entry + 4:]) == {33}
    pos, cost, plain = 10, 0.0, 0.0  # what the bad stretch cost after the entry, by the curve, against plain steps
    for r in out.rounds:
        if bad[entry] < pos < 400:
            cost += (c.draft(r.drafted + 1, pos) if r.drafted else 0) + c.target(r.verified + 1, pos)
            plain += r.emitted * c.target(1, pos)
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
    c = curve(0.1)
    planner = by_curve(c)
    draft = ScriptedDraft(right=lambda p: p < 290)

    def generate(prompt: int, n: int) -> tuple[list, float]:  # the rounds, and their cost by the curve over plain steps
        out = generate_dflash(target, draft, TRUTH[:prompt], n, set(), 1024, 16, 16, MASK, planner=planner)
        assert out.tokens == TRUTH[prompt:prompt + n]
        pos, cost, plain = prompt, 0.0, 0.0
        for r in out.rounds:
            cost += (c.draft(r.drafted + 1, pos) if r.drafted else 0) + c.target(r.verified + 1, pos)
            plain += r.emitted * c.target(1, pos)
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
    emitted nothing more, so the openings' window credits none, and a longer reply opens with a block of 5 too
    (extrapolating the accepted proposals would open it with 16)."""
    planner = by_curve(curve(0.1))
    for _ in range(40):
        out = generate_dflash(target, ScriptedDraft(), TRUTH[:10], 6, set(), 1024, 16, 16, MASK, planner=planner)
        assert out.tokens == TRUTH[10:16] and len(out.rounds) == 1
    out = generate_dflash(target, ScriptedDraft(), TRUTH[:10], 40, set(), 1024, 16, 16, MASK, planner=planner)
    assert out.tokens == TRUTH[10:50] and out.rounds[0].drafted == 4


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


def drive(planner, rounds: int, accepts: bool, seconds=lambda block, verified: 0.0, pos: int = 100) -> list[int]:
    """`rounds` rounds of a draft sure of every proposal (all accepted, or none), `seconds` each; their blocks."""
    sure = torch.full((15, V), -10.0)
    sure[:, 0] = 10.0
    blocks = []
    for _ in range(rounds):
        b = planner.block(pos, 16)
        k = planner.verify_count(sure[:b - 1], pos) if b > 1 else 0
        accepted = k if accepts else 0
        planner.observe(k, accepted, seconds=seconds(b, k))
        blocks.append(b)
        pos += accepted + 1
    return blocks


def plain_stretches(blocks: list[int]) -> list[int]:
    """The lengths of the runs of plain steps (block 1) between drafting rounds."""
    return [len(run) for run in "".join("p" if b == 1 else "d" for b in blocks).split("d") if run]


def test_falling_back_it_probes_after_longer_stretches_and_drafts_at_once_when_a_probe_pays():
    planner = by_curve(curve(0.1))
    failing = drive(planner, 120, accepts=False)
    stretches = plain_stretches(failing)
    assert failing[0] > 1 and stretches[:6] == [2, 4, 8, 16, 32, 32]  # gaps doubling up to 32 (the curve prices probes)
    assert failing[-1] == 1  # still falling back: the next drafting round is a probe
    paying = drive(planner, 40, accepts=True, pos=400)
    first = paying.index(next(b for b in paying if b > 1))
    assert all(b > 1 for b in paying[first:])  # the probe paid: drafting again at once, and on


def test_a_probe_dearer_than_plain_steps_buys_a_longer_plain_stretch():
    """A probe that took 5 plain steps' time to emit one token (its draft read a long prompt first) is followed by
    a longer plain stretch than one that took 2: probing a draft that never accepts costs the same share of
    decoding's time however dear its probes are. Wall times price it when the planner learns them."""
    stretch = {}
    for ms in (2.0, 5.0):
        planner = auto_planner(curve(0.1), 16, time_weight=0.05)
        blocks = drive(planner, 200, accepts=False, seconds=lambda b, k: ms / 1000 if b > 1 else 0.001)
        stretch[ms] = plain_stretches(blocks)[0]
    assert stretch[2.0] == 2 and 3 * 2 <= stretch[5.0] <= 4 * 2


def test_confidence_is_read_only_while_choosing_k_pays_for_it():
    """Reading the draft's confidence costs host time (the curve's confidence_ms): a draft sure of 3 proposals and
    unsure of the rest has most rounds verify just the 3 while reading is cheap against what choosing k saves;
    once reading costs more than that, only every 8th round and probes read it, and the rest verify all."""
    share = {}
    for ms in (0.0, 100.0):
        out = run(ScriptedDraft(confidence=lambda i: 0.97 if i < 3 else 0.12), by_curve(replace(curve(0.3), confidence_ms=ms)))
        drafted = [r for r in out.rounds[:-1] if r.drafted]
        share[ms] = sum(r.verified == 3 for r in drafted) / len(drafted)
    assert share[0.0] > 0.9 and share[100.0] < 0.25


def test_cost_curve_file_round_trip_and_errors(tmp_path):
    c = replace(curve(), programs="these")
    (tmp_path / "c.json").write_text(__import__("json").dumps(c.to_dict()))
    assert CostCurve.load(tmp_path / "c.json", "these") == c
    assert c.target(2, 500) == pytest.approx(1.1) and c.draft(16, 0) == pytest.approx(0.62)
    with pytest.raises(UserError, match="measured on other programs than these; rerun the bench stage"):
        CostCurve.load(tmp_path / "c.json", "others")
    for bad, why in (("{}", "positions"), ("[1", "parse error"), ('{"positions": [0], "target_ms": [[1, 2]], '
                                                                 '"draft_ms": [[1, 2]]}', "differ in length")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(UserError, match=f"bad.json is not a cost curve .*{why}.*; the bench stage writes one"):
            CostCurve.load(tmp_path / "bad.json", "these")
    with pytest.raises(UserError, match=r"missing.json is not a cost curve \(it cannot be read\)"):
        CostCurve.load(tmp_path / "missing.json", "these")
    uneven = replace(curve(), draft_ms=[row[:-1] for row in curve().draft_ms])  # a curve built in Python, not read
    with pytest.raises(UserError, match=r"^the cost curve given is not a cost curve \(the rows of target_ms and "
                                        r"draft_ms differ in length\)"):
        uneven.target(2, 0)


def test_what_rounds_cost_beyond_the_curve_is_learned_per_call():
    """Rounds that take 2 ms a call longer than the curve says (host work, cold caches) make plain steps and
    drafting compare at their real cost."""
    c = curve(0.1)
    p = auto_planner(c, 16)
    for _ in range(200):
        b, k = p.block(100, 16), 0
        if b > 1:
            k = p.verify_count(torch.zeros(b - 1, V), 100)  # unsure: verifies few or none
        ms = (c.draft(b, 104) if b > 1 else 0.0) + c.target(k + 1, 104)  # the curve at the middle of 96..111
        p.observe(k, 0, seconds=(ms + 2.0 * (1 + (b > 1))) / 1000)
    assert p.learned()[1] == pytest.approx(2.0, rel=1e-3)


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


def test_without_a_compiler_the_runtime_says_in_one_line_how_to_get_the_runners_libraries(monkeypatch, tmp_path):
    """No cmake and no runner/ sources to build the host library and kernels from, none installed: one line with the
    fix."""
    from dflash_et.runtime import native

    monkeypatch.delenv("DFLASH_HOST_LIBRARY", raising=False)
    monkeypatch.setattr(native, "PACKAGE_CLONE", tmp_path)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match=r"^running programs needs the runner's host library \(libdflash_host.so\) "
                                        r"and kernels \(libdflash_llama_ops.so\), .*run `make runner` in a clone"):
        native.find_library()


def test_without_cmake_a_clone_uses_the_library_built_there(monkeypatch, tmp_path):
    """A clone whose runner was built (`make runner`) on a machine that now has no cmake: that library, not a
    refusal (nothing can check it is up to date, and nothing else could be used)."""
    from dflash_et.runtime import native

    built = tmp_path / native.BUILD / native.LIBRARY
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    (tmp_path / "runner" / "CMakeLists.txt").write_text("")
    monkeypatch.delenv("DFLASH_HOST_LIBRARY", raising=False)
    monkeypatch.setattr(native, "PACKAGE_CLONE", tmp_path)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert native.find_library() == built


def test_a_host_library_without_its_kernels_beside_it_is_one_line(tmp_path):
    """DFLASH_HOST_LIBRARY (or an installed runner) naming a host library whose kernels were not copied with it."""
    from dflash_et.runtime import native

    host = tmp_path / native.LIBRARY
    host.write_bytes(b"")
    with pytest.raises(UserError, match=r"libdflash_llama_ops.so is missing beside libdflash_host.so; run `make "
                                        r"runner` where it was built$"):
        native.kernels_beside(host)
    (tmp_path / native.KERNELS).write_bytes(b"")
    assert native.kernels_beside(host) == tmp_path / native.KERNELS


def test_a_failed_build_of_the_planner_is_the_toolchains_one_line(monkeypatch, tmp_path):
    """The toolchain's own `error: ...` line (here a stand-in's) becomes the UserError, without its prefix."""
    from dflash_et.runtime import native

    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "CMakeLists.txt").write_text("")
    (tmp_path / "runner" / "__init__.py").write_text("")
    (tmp_path / "runner" / "toolchain.py").write_text(
        "import sys\nsys.exit('error: building the C++ runner failed (`cmake --build`); its output is in build.log')\n")
    monkeypatch.delenv("DFLASH_HOST_LIBRARY", raising=False)
    monkeypatch.setattr(native, "PACKAGE_CLONE", tmp_path)
    monkeypatch.setattr(native.shutil, "which", lambda name: "/usr/bin/cmake")
    with pytest.raises(UserError, match=r"^building the C\+\+ runner failed \(`cmake --build`\); its output is in "
                                        r"build.log$"):
        native.find_library()
