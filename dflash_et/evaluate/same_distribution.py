"""Does sampled DFlash through the programs have the target's distribution? A goodness-of-fit test
against the target's own probabilities.

Many short completions of each prompt are sampled with DFlash (both proposal modes). Under exact
sampling, the token at each generated position is drawn from the target's processed distribution
after the completion's prefix, `p(. | prompt + prefix)` (temperature, top-k, top-p: what plain
sampling draws from). One target call per distinct completion gives those distributions for all
its prefixes; at each position the tokens seen are compared with the counts the distributions
expect (their sum over the completions) by Pearson's chi-square test. Tokens expected fewer than 5
times are pooled, and so are tokens the target's top-k or top-p excludes: a rounding between two
call shapes can move that boundary, so they are counted and reported, not a failure by themselves.
With prefixes that differ the counts are not one multinomial's, and the statistic is then
stochastically smaller than the chi-square it is read against: the test stays conservative. Each
p-value must exceed alpha divided by the number of tests (Bonferroni): for correct sampling the
check fails with probability below alpha, whatever the checkpoint, and with the fixed seeds it
gives the same verdict every run.
Against the two-sample test with plain sampling it replaced, it needs no plain completions and has
the power of twice the samples. The smallest p-value is reported beside the largest total-variation
distance of a position's tokens from what the target expects there.
"""

from collections import Counter
from dataclasses import dataclass, replace

import torch

from dflash_et.runtime.generate import Generation, TargetFn, generate_dflash, pooled_tau
from dflash_et.runtime.programs import DraftProgram, TargetProgram, max_block_len
from dflash_et.runtime.sampling import PROPOSALS, Sampler, Sampling, distribution


@dataclass(frozen=True)
class SamplingCheck:
    """The `validate.sampling` section of params.yaml (what each setting does: its comment there)."""

    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int | None = 20
    samples: int = 500
    tokens: int = 6
    prompts: int = 2
    alpha: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"validate.sampling.temperature must be positive (the check compares sampled "
                             f"distributions), got {self.temperature}")
        self.settings("argmax", self.seed)  # top_p and top_k are checked where sampling is defined
        for name, least in (("samples", 1), ("tokens", 2), ("prompts", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"validate.sampling.{name} must be at least {least}, got {getattr(self, name)}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"validate.sampling.alpha must be in (0, 1), got {self.alpha}")

    def settings(self, proposals: str, seed: int) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k, proposals, seed)


def chi_square(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the test that samples `a` and `b` (category -> count)
    come from one distribution. Categories expected fewer than `min_expected` times in either sample are
    pooled, as the chi-square approximation needs."""
    n_a, n_b = sum(a.values()), sum(b.values())
    bins, rare = [], [0, 0]
    for key in a.keys() | b.keys():
        pair = (a[key], b[key])
        if min(n_a, n_b) * sum(pair) / (n_a + n_b) < min_expected:
            rare = [rare[0] + pair[0], rare[1] + pair[1]]
        else:
            bins.append(pair)
    if sum(rare):
        bins.append(tuple(rare))
    if len(bins) < 2:
        return 0.0, 0, 1.0
    counts = torch.tensor(bins, dtype=torch.float64)
    expected = counts.sum(1, keepdim=True) * counts.sum(0, keepdim=True) / counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    dof = len(bins) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, dof, p


def total_variation(a: Counter, b: Counter | torch.Tensor) -> float:
    """Half the L1 distance between sample `a`'s frequencies and sample `b`'s, or the probabilities `b` [V]:
    how far apart they are, on a 0-1 scale."""
    n_a = sum(a.values())
    if isinstance(b, torch.Tensor):
        seen = sum(abs(count / n_a - float(b[k])) for k, count in a.items())
        return 0.5 * (seen + 1.0 - float(b[list(a)].sum()))
    n_b = sum(b.values())
    return 0.5 * sum(abs(a[k] / n_a - b[k] / n_b) for k in a.keys() | b.keys())


class PrefillOnce:
    """target.pte with the prompt's prefill calls answered from the first time they ran.

    Every completion of a prompt starts with the same prefill, and later calls write only at the
    prompt's length and after, so the cache still holds the prompt: the same outputs, at half the
    cost. A sliding layer's ring (window + longest call - 1 rows) keeps the prompt's last `window`
    rows only while a completion is at most one longest call long: `check_sampling` asks for that."""

    def __init__(self, target: TargetFn, prompt_length: int):
        self.target, self.prompt_length, self.answers = target, prompt_length, {}

    def __call__(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if int(input_pos[0]) >= self.prompt_length:
            return self.target(tokens, input_pos)
        key = (int(input_pos[0]), tuple(tokens[0].tolist()))
        if key not in self.answers:
            self.answers[key] = self.target(tokens, input_pos)
        return self.answers[key]


def goodness_of_fit(observed: Counter, expected: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """(statistic, degrees of freedom) of Pearson's test of `observed` (token -> count) against `expected`
    counts [V] (same total). Tokens expected fewer than `min_expected` times are pooled (into the smallest
    bin when the pool is still too small), those expected never among them: the target's top-k or top-p
    boundary can move by a rounding between the call that drew a token and the call that checks it."""
    n = sum(observed.values())
    expected = expected.double()
    bins = [[observed[t], float(expected[t])] for t in (expected >= min_expected).nonzero().squeeze(1).tolist()]
    rare = [n - sum(o for o, _ in bins), float(expected.sum()) - sum(e for _, e in bins)]
    if rare[1] >= min_expected or not bins:
        bins.append(rare)
    else:
        smallest = min(bins, key=lambda b: b[1])
        smallest[0], smallest[1] = smallest[0] + rare[0], smallest[1] + rare[1]
    if len(bins) < 2:
        return 0.0, 0
    return sum((o - e) ** 2 / e for o, e in bins), len(bins) - 1


def p_value(statistic: float, dof: int) -> float:
    """The chi-square distribution's upper tail (1 with no degrees of freedom: nothing was tested)."""
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def conditionals(target: TargetFn, prompt: list[int], completion: list[int], chunk: int, rewinds: bool) -> torch.Tensor:
    """Logits [len(completion), V]: row i is the target's next-token logits after prompt + completion[:i].

    `rewinds`: the cache still holds the prompt (attention only), so one call from the prompt's last token
    does (a verify call's shape); otherwise a prefill from position 0 (a recurrent state cannot go back)."""
    if rewinds:
        tokens = prompt[-1:] + completion[:-1]
        logits, _ = target(torch.tensor([tokens]), torch.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens)))
        return logits[0]
    sequence, rows = prompt + completion[:-1], []
    for i in range(0, len(sequence), chunk):
        piece = sequence[i:i + chunk]
        logits, _ = target(torch.tensor([piece]), torch.arange(i, i + len(piece)))
        rows.append(logits[0])
    return torch.cat(rows)[-len(completion):]


def check_sampling(programs: tuple[TargetProgram, DraftProgram | None], prompts: list[list[int]],
                   labels: list[str], eos: set[int], mask_token_id: int | None, check: SamplingCheck) -> dict:
    """Sample `check.samples` completions per prompt with DFlash in each proposal mode (without a draft: lookup
    proposals, point masses, in both), through the programs,
    and test each generated position's tokens against the counts target.pte's own distribution expects
    after each completion's prefix (one target call per distinct completion gives all its prefixes).

    `tau` (tokens per round, by mode) says how much the check tested the acceptance rule: near 1, the target
    rejected almost every proposal, and the tokens came from the residual draws (a DFlash2 draft's walk then
    shows in them through its q only); a wrong q or rule shows most where proposals are accepted."""
    target_p, draft_p = programs
    if not prompts:
        raise ValueError("the sampling check needs at least one prompt")
    max_seq_len, chunk = target_p.meta.max_context_len, target_p.meta.max_seq_len
    block = max_block_len(target_p, draft_p)
    reference = check.settings("argmax", check.seed)
    tests, worst_p, worst_where, max_tv, unexpected = 0, 1.0, None, 0.0, 0
    generated: dict[str, list[Generation]] = {}  # each mode's, for its tau
    for n, (ids, label) in enumerate(zip(prompts[:check.prompts], labels)):
        seed = check.seed + 3 * n * check.samples  # every completion of every run its own seed
        # (a hybrid target's recurrent state cannot go back to the prompt's end: it prefills every time)
        once = check.tokens <= target_p.meta.max_seq_len and not target_p.meta.recurrent_state
        target = PrefillOnce(target_p, len(ids)) if once else target_p
        exact: dict[tuple[int, ...], torch.Tensor] = {}  # completion -> [len, V] probabilities, for both modes
        for m, proposals in enumerate(PROPOSALS, start=1):
            settings = check.settings(proposals, seed + m * check.samples)
            generations = [generate_dflash(target, draft_p, ids, check.tokens, eos, max_seq_len, chunk, block,
                                           mask_token_id, sampler=Sampler(replace(settings, seed=settings.seed + i)))
                           for i in range(check.samples)]
            runs = [tuple(g.tokens) for g in generations]
            generated.setdefault(proposals, []).extend(generations)
            for c in runs:
                if c not in exact:
                    exact[c] = distribution(conditionals(target_p, ids, list(c), chunk, once), reference)
            for position in range(1, check.tokens + 1):
                going = [c for c in runs if len(c) >= position and not eos & set(c[:position - 1])]
                if not going:
                    continue
                observed = Counter(c[position - 1] for c in going)
                expected = sum(exact[c][position - 1].double() for c in going)
                p = p_value(*goodness_of_fit(observed, expected))
                max_tv = max(max_tv, total_variation(observed, expected / len(going)))
                unexpected += sum(count for t, count in observed.items() if float(expected[t]) == 0.0)
                tests += 1
                if p < worst_p or worst_where is None:
                    worst_p, worst_where = p, f"{label}, {proposals} proposals, generated token {position}"
    threshold = check.alpha / max(tests, 1)
    return {"settings": {**reference.settings(), "proposals": list(PROPOSALS)},
            "samples": check.samples, "tokens": check.tokens, "block_size": block, "tests": tests,
            "min_p_value": worst_p, "where": worst_where, "threshold": threshold, "max_total_variation": max_tv,
            "tokens_the_target_excludes": unexpected, "same_distribution": worst_p >= threshold,
            "tau": {proposals: pooled_tau(runs) for proposals, runs in generated.items()}}
