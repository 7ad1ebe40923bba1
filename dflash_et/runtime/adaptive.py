"""Adaptive verify length (`block_size: auto`): how many proposals each round drafts and verifies.

A round that drafts a block of B and verifies its first k proposals costs draft(B) + target(k + 1)
on this device (`CostCurve`, measured once, at the round's cache position) and emits on average

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_k

tokens, a_i being the chance the target accepts proposal i once it accepted those before it.

- Per round, the draft's probability of its top token at each position, through `Calibration`
  (learned online from what the target accepts), gives a_i, and the round verifies the k with the
  most expected tokens per ms, its draft call included.
- The block B is the one that would have given the most tokens per ms over the last rounds, judged
  by what the target accepted in them; it is decided anew every 4th round. A generation's first round
  takes the block its last openings would have done best with.
- When both the last few rounds and the window say a plain target step (B = 1) gives more, it
  decodes plainly and probes the draft again after 2, 4, ... 32 plain steps, each stretch as many times
  longer as the probe before it cost beyond the plain steps it stood for (a probe after a long prompt makes
  the draft read all of it first: 3-4 plain steps' worth): a draft that never helps costs at most a 32nd
  of decoding's time, and one that starts helping again is back as soon as the last few rounds say so.
  A few bad rounds in a row alone, common with a good draft, do not stop it.
- All it learns of the draft is kept per band of context (the depth a generation opens at, doubling: under
  128 positions, 128-255, 256-511, ...): a draft trained on short chats accepts nothing after a document, and
  one state for both let long prompts draft on what short ones had earned while short ones fell back after
  them (docs/measurements.md#auto-per-band-of-context-2026-12-05). A band not seen yet starts from the
  nearest one seen, until its own first round replaces that.

k depends on the draft's probabilities only, never on the tokens a round samples, so verifying any
prefix keeps DFlash exact: greedy output is plain greedy decoding's, sampled output has its
distribution. Decisions use the cost curve plus what rounds take beyond it (learned from their wall
times), so they vary from run to run; the tokens do not.
"""

import copy
import math
import time

import torch

from dflash_et.runtime.cost_curve import CostCurve, confidence

AUTO = "auto"  # block_size: auto


def plans(block_size: int | str, greedy: bool) -> bool:
    """Whether a generation at `block_size` is planned round by round. Sampled, auto keeps the largest block: its
    choices (device timings, what it learned) would decide which random draws a round makes, and a seed must
    give the same tokens on every run. (runner/src/decode.cpp keeps the same rule.)"""
    return block_size == AUTO and greedy


class Calibration:
    """P(the target accepts a proposal | the draft's probability of its top token there), by bins of that
    probability, learned online. Each bin starts from `prior_weight` pseudo-observations at its own centre
    (a calibrated draft); what rounds show is discounted by `memory` per round, so that it follows a draft
    that goes from right to wrong (another kind of text) within tens of rounds, not hundreds."""

    def __init__(self, bins: int = 10, prior_weight: float = 1.0, memory: float = 0.95):
        self.prior = [((b + 0.5) / bins * prior_weight, prior_weight) for b in range(bins)]
        self.accepted, self.tried, self.memory = [0.0] * bins, [0.0] * bins, memory
        self.rate = [a / t for a, t in self.prior]

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * len(self.rate)), len(self.rate) - 1)

    def __call__(self, confidence: list[float]) -> list[float]:
        return [self.rate[self._bin(c)] for c in confidence]

    def observe(self, confidence: list[float], accepted: int) -> None:
        """A round verified len(confidence) proposals and the target accepted the first `accepted`: those
        were accepted, the next rejected, and the rest (if any) were never put to the test."""
        m = self.memory
        self.accepted, self.tried = [a * m for a in self.accepted], [t * m for t in self.tried]
        for i, c in enumerate(confidence[:accepted + 1]):
            b = self._bin(c)
            self.tried[b] += 1
            self.accepted[b] += i < accepted
        self.rate = [(pa + a) / (pt + t) for (pa, pt), a, t in zip(self.prior, self.accepted, self.tried)]


def expected_tokens(acceptance: list[float]) -> list[float]:
    """E(k) for k = 0..n: tokens a round emits on average when it verifies the first k of n proposals."""
    out, reach = [1.0], 1.0
    for a in acceptance:
        reach *= a
        out.append(out[-1] + reach)
    return out


class _Window:
    """E(k) rows of the last `size` rounds, with their sums over all of them (`total`) and over the last
    `react` (`lately`), kept current row by row. It starts from one row (a prior: what the planner believes
    before any round), so that the first rounds it sees weigh as much as they say: from a full window of prior
    rows, a draft that never accepted in a new context drafted tens of rounds before the window let it stop.
    A prior `borrowed` from another band of context is replaced by the first round seen here: weighed as one
    round, a short band's rounds kept a draft that accepted nothing after a document drafting for 3 more
    rounds after its first rejection (docs/measurements.md#auto-per-band-of-context-2026-12-05)."""

    def __init__(self, row: list[float], size: int, react: int, borrowed: bool = False):
        self.rows, self.size, self.react = [row], size, react
        self.total, self.lately = row[:], row[:]
        self.borrowed = borrowed  # the prior row is another band's: the first round seen here replaces it

    def mean(self) -> list[float]:
        return [t / len(self.rows) for t in self.total]

    def add(self, row: list[float]) -> None:
        if self.borrowed:
            self.rows, self.total, self.lately, self.borrowed = [row], row[:], row[:], False
            return
        if len(self.rows) >= self.react:
            self.lately = [t - o + e for t, o, e in zip(self.lately, self.rows[-self.react], row)]
        else:
            self.lately = [t + e for t, e in zip(self.lately, row)]
        if len(self.rows) == self.size:
            self.total = [t - o + e for t, o, e in zip(self.total, self.rows.pop(0), row)]
        else:
            self.total = [t + e for t, e in zip(self.total, row)]
        self.rows.append(row)


BAND = 128  # bands of context: band 0 holds generations opening below BAND, band i those at BAND * [2^(i-1), 2^i)


def band_of(pos: int) -> int:
    """The band of context of a generation that opens at `pos` (its prompt's length): doubling with depth."""
    return (pos // BAND).bit_length()


class _Band:
    """What the planner knows of the draft in one band of context: how often the target accepts its proposals
    (by confidence and by position), the windows of rounds, and whether it is falling back to plain steps. A
    draft may be right after short prompts and wrong after long ones (the built-in draft trained on short chats
    accepts nothing after a document): with one state for all, long prompts drafted on what short ones had
    earned, and short ones fell back after them."""

    def __init__(self, calibration: Calibration, position_rate: list[float], later: list[float],
                 openings: list[float], window: int, react: int, chosen: int):
        self.calibration, self.position_rate = calibration, position_rate
        self.later, self.openings = _Window(later, window, react), _Window(openings, window, react)
        self.chosen, self.probe_gap, self.plain_left, self.falling_back = chosen, 2, 0, False

    def seeded(self) -> "_Band":
        """A band not seen yet starts from this one (the nearest seen): what it learned, each window held as
        one round until the new band's first round replaces both."""
        band = _Band(copy.deepcopy(self.calibration), self.position_rate[:], self.later.mean(),
                     self.openings.mean(), self.later.size, self.later.react, self.chosen)
        band.later.borrowed = band.openings.borrowed = True
        band.probe_gap, band.plain_left, band.falling_back = self.probe_gap, self.plain_left, self.falling_back
        return band


class AdaptivePlanner:
    """Per-round choices for one stream of generations; it keeps what it learns across them.

    The draft block B (1: a plain step) is the one with the most tokens per ms, d(B) + t(B), over the
    last `window` rounds, judged by what the target accepted in them and, past what they verified, by
    how often it accepted each position lately. It falls back to plain steps when the last `react` rounds
    and the whole window say they are better, and drafts again when the last `react` say it pays;
    falling back, it probes the draft after 2, 4, .. `max_probe_gap` plain steps, times what the probe before
    cost in plain steps beyond those it stood for.
    All of that it learns per band of context (`band_of` the generation's opening position, `_Band`): a draft
    that stops accepting after long prompts stops being paid for there and keeps its blocks after short ones.
    A generation's first round (its opening, right after the prompt) chooses its block from a window of
    openings alone: there the reply often goes as the prompt leads (the built-in pair at block 16: 10.9
    proposals accepted in openings, 3.6-5.9 in later rounds; code 15 of 15), so one block for all rounds
    is too short for openings or too long for the rest.
    It runs between every two program calls, so it works on short Python lists: numpy's per-call cost
    (with the CPU's caches cold from a program call) made it several times dearer."""

    def __init__(self, curve: CostCurve, max_block: int, window: int = 32, react: int = 4, max_probe_gap: int = 32,
                 time_weight: float = 0.05):
        self.curve, self.max_block = curve, min(max_block, curve.max_block)
        position_rate = [0.9] * (self.max_block - 1)  # how often proposal i was accepted when tested
        optimistic = expected_tokens(position_rate)  # what windows hold at first
        self.band = _Band(Calibration(), position_rate, optimistic, optimistic, window, react, self.max_block)
        self.bands: dict[int, _Band] = {}  # those seen, by band_of; self.band: the current generation's
        self.rounds, self.max_probe_gap, self._opening, self._probing = 0, max_probe_gap, False, False
        self._rejected = False  # the last round's first proposal was rejected: its block is decided anew
        self._confidence, self._acceptance, self._pos, self._block = [], [], 0, 1
        self.saving = float("inf")  # ms a round saves by choosing k, lately, by the cost curve
        self.per_call = 0.0  # ms each program call takes here beyond the curve (host work, caches), learned
        self.time_weight = time_weight  # how fast per_call follows the rounds' wall times (0: the curve alone,
        # probes priced by it too)
        self._started = 0.0
        self._pending: tuple[int, list[float], bool] | None = None  # the last round's (accepted, row, opening),
        # until the next round shows whether its generation went on
        self._next_pos = 0
        self._costs: dict[int, tuple[list[float], list[float]]] = {}

    def _cost(self, pos: int) -> tuple[list[float], list[float]]:
        """(target ms of T = 1..max_block tokens, draft ms of B = 1..max_block with 0 for B = 1 (no call)),
        per 16 positions."""
        bucket = pos // 16
        if bucket not in self._costs:
            at = bucket * 16 + 8
            self._costs[bucket] = ([self.curve.target(t, at) for t in range(1, self.max_block + 1)],
                                   [0.0] + [self.curve.draft(b, at) for b in range(2, self.max_block + 1)])
        return self._costs[bucket]

    def _round_ms(self, pos: int, block: int, verified: int) -> float:
        """A round drafting `block` (1: none) and verifying `verified` proposals: the curve plus what each
        program call has lately taken beyond it."""
        target, draft = self._cost(pos)
        return draft[block - 1] + target[verified] + self.per_call * (1 + (block > 1))

    def block(self, pos: int, room: int) -> int:
        """The draft block for the round at `pos` (1: a plain target step), at most `room` tokens. Drafting,
        it decides anew every 4th round and keeps its choice in between (deciding costs host time); an
        opening that drafts takes the block its own window says."""
        opening = pos != self._next_pos
        if self._pending:
            self._commit(ended=opening)
        if opening:
            self.band = self._band_at(pos)
        self._probing, self._pos, self._block, self._started = False, pos, 1, time.perf_counter()
        block = self._later_block(pos, room)
        self._opening = opening and block > 1 and not self._probing
        if self._opening:
            cost = [self._round_ms(pos, b, b - 1) for b in range(1, min(room, self.max_block) + 1)]
            total = self.band.openings.total
            block = 2 + max(range(len(cost) - 1), key=lambda b: total[b + 1] / cost[b + 1])
        return block

    def _band_at(self, pos: int) -> _Band:
        """The state of `pos`'s band; one not seen yet starts from the nearest seen (the shallower on ties)."""
        key = band_of(pos)
        if key not in self.bands:
            nearest = min(self.bands, key=lambda k: (abs(k - key), k), default=None)
            self.bands[key] = self.band if nearest is None else self.bands[nearest].seeded()
        return self.bands[key]

    def _later_block(self, pos: int, room: int) -> int:
        """The block the window of rounds past their generation's opening says, or 1 (falling back)."""
        band = self.band
        if band.plain_left > 0:  # falling back: nothing learned since the last probe
            band.plain_left -= 1
            return 1
        room = min(room, self.max_block)
        if room < 2:
            return 1
        if self.rounds % 4 and not self._rejected and not band.falling_back and band.chosen <= room:
            return band.chosen
        cost = [self._round_ms(pos, b, b - 1) for b in range(1, room + 1)]
        total = band.later.total
        band.chosen = 2 + max(range(room - 1), key=lambda b: total[b + 1] / cost[b + 1])

        def drafting_pays(sums: list[float]) -> bool:  # tokens per ms: some block beats a plain step (sums[0])
            return any(sums[b] / cost[b] > sums[0] / cost[0] for b in range(1, room))

        # hysteresis: a short bad stretch alone does not stop drafting, a short good one restarts it
        if drafting_pays(band.later.lately) or (not band.falling_back and drafting_pays(total)):
            band.probe_gap, band.falling_back = 2, False
        else:  # a probe: the best drafting block; when it does not pay, the next plain stretch is twice as long
            self._probing, band.plain_left, band.falling_back = True, band.probe_gap, True
            band.probe_gap = min(2 * band.probe_gap, self.max_probe_gap)
        return band.chosen

    def verify_count(self, draft_logits: torch.Tensor, pos: int) -> int:
        """How many of the draft's proposals (logits [B-1, V]) to verify: the k with the most expected
        tokens per ms for this round, the draft call included. Reading the draft's confidence costs host
        time (a softmax over the vocabulary, `CostCurve.confidence_ms`): while choosing k has lately saved
        less than that, a round verifies all its proposals, and only probes and every 8th round read it."""
        n = draft_logits.shape[0]
        self._pos, self._block = pos, n + 1
        if self.saving <= self.curve.confidence_ms and self.rounds % 8 and not self._probing:
            self._confidence, self._acceptance = [], self.band.position_rate[:]
            return n
        self._confidence = confidence(draft_logits)
        self._acceptance = self.band.calibration(self._confidence) + self.band.position_rate[n:]
        expected = expected_tokens(self._acceptance)
        cost = [self._round_ms(pos, n + 1, k) for k in range(n + 1)]
        k = max(range(n + 1), key=lambda k: expected[k] / cost[k])
        saved = expected[k] * cost[n] / expected[n] - cost[k]  # ms to emit the same tokens verifying all n
        self.saving = saved if self.saving == float("inf") else self.saving + 0.1 * (saved - self.saving)
        return k

    def _commit(self, ended: bool) -> None:
        """The last round's row, once the next round shows whether the generation went on: if it ended there
        (end of text, max tokens), a longer block would have emitted nothing more. The built-in pair's
        replies are ~3 rounds long: on the same text, block 16 emits 18% more than block 12 in rounds
        within a reply, none more in final ones, 13% more over all; counting final rounds as continued
        credited it the 18%."""
        accepted, seen, opening = self._pending
        if ended:
            seen = seen[:accepted] + [0.0] * (len(seen) - accepted)
        row = expected_tokens(seen)
        (self.band.openings if opening else self.band.later).add(row)
        for window in (self.band.openings, self.band.later):  # the band's first round: all it knows of it
            window.borrowed and window.add(row)
        self.rounds += 1
        self._pending = None

    def observe(self, verified: int, accepted: int, seconds: float | None = None) -> None:
        """What the target made of the round's first `verified` proposals, and the round's wall time (default:
        since `block`): what it cost beyond the curve (host work, cold caches: on this project's VM about
        1 ms a call) is spread over its program calls and learned, so that plain steps and rounds compare
        at their real cost."""
        seconds = time.perf_counter() - self._started if seconds is None else seconds
        target, draft = self._cost(self._pos)
        b = self._block
        over = (1000 * seconds - draft[b - 1] - target[verified]) / (1 + (b > 1))
        self.per_call = max(0.0, self.per_call + self.time_weight * (over - self.per_call))
        self._next_pos = self._pos + accepted + 1
        self._rejected = verified > 0 and accepted == 0
        if b == 1:
            return
        band = self.band
        if self._probing:
            plain, priced = self._round_ms(self._pos, 1, 0), self._round_ms(self._pos, b, verified)
            if (accepted + 1) * plain > priced:  # it paid: the draft may be right again; decide at once
                band.plain_left, band.probe_gap = 0, 2
            else:  # it did not: what it cost beyond the plain steps it stood for prices the next
                spent = 1000 * seconds if self.time_weight else priced
                band.plain_left = max(band.plain_left, math.ceil(band.plain_left * (spent / plain - accepted - 1)))
        if not verified:  # none put to the test: the round counts as its draft's confidence said
            self._pending = 0, self._acceptance, self._opening
            return
        if self._confidence:
            band.calibration.observe(self._confidence[:verified], accepted)
        for i in range(min(accepted + 1, verified)):
            band.position_rate[i] += 0.05 * ((i < accepted) - band.position_rate[i])
        if accepted < verified:  # rejected there: nothing after it would have counted
            self._pending = accepted, [1.0] * accepted + [0.0] * (len(self._acceptance) - accepted), self._opening
        else:
            self._pending = accepted, [1.0] * accepted + self._acceptance[accepted:], self._opening
