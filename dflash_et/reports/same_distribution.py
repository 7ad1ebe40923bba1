"""Does sampled DFlash through the programs have the target's distribution? A two-sample test.

Many short completions of each prompt are sampled with DFlash (both proposal modes) and with plain
sampling of target.pte; at each generated position after the first (which both take from the same
prefill, before any draft is involved) the two samples of tokens are compared with Pearson's
chi-square test of homogeneity (tokens too rare for the test's approximation are pooled
into one bin). Each comparison's p-value must exceed alpha divided by the number of comparisons
(Bonferroni): for correct sampling the check fails with probability below alpha, whatever the
checkpoint, and with the fixed seeds it gives the same verdict every run. The smallest p-value is
reported beside the largest total-variation distance seen, which says how far apart the samples
were.
"""

from collections import Counter
from dataclasses import dataclass, replace

import torch

from dflash_et.runtime.generate import TargetFn, generate_ar, generate_dflash
from dflash_et.runtime.programs import DraftProgram, TargetProgram
from dflash_et.runtime.sampling import PROPOSALS, Sampler, Sampling

END = -1  # the "token" at positions after a completion stopped at EOS


@dataclass(frozen=True)
class SamplingCheck:
    """The `validate.sampling` section of params.yaml."""

    temperature: float = 1.0
    top_p: float = 0.9
    top_k: int | None = 20
    samples: int = 1000       # completions per prompt and mode
    tokens: int = 6           # tokens generated per completion (positions 2.. are compared)
    prompts: int = 2
    alpha: float = 1e-3       # chance that correct sampling fails the check
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


def total_variation(a: Counter, b: Counter) -> float:
    """Half the L1 distance between the two samples' frequencies: how far apart they are, on a 0-1 scale."""
    n_a, n_b = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / n_a - b[k] / n_b) for k in a.keys() | b.keys())


def _per_position_counts(completions: list[list[int]], tokens: int) -> list[Counter]:
    """Per generated position after the first, how often each token (END after EOS) was sampled there."""
    return [Counter(c[i] if i < len(c) else END for c in completions) for i in range(1, tokens)]


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


def check_sampling(programs: tuple[TargetProgram, DraftProgram], prompts: list[list[int]], labels: list[str],
                   eos: set[int], mask_token_id: int, check: SamplingCheck) -> dict:
    """Sample `check.samples` completions per prompt with plain sampling and with DFlash in each proposal
    mode, through the programs, and compare them position by position."""
    target_p, draft_p = programs
    if not prompts:
        raise ValueError("the sampling check needs at least one prompt")
    max_seq_len, chunk = target_p.meta["max_seq_len"], target_p.meta["max_chunk"]
    block = draft_p.meta["max_block_size"]
    tests, worst_p, worst_where, max_tv = 0, 1.0, None, 0.0
    for n, (ids, label) in enumerate(zip(prompts[:check.prompts], labels)):
        seed = check.seed + 3 * n * check.samples  # every completion of every run its own seed
        # (a hybrid target's recurrent state cannot go back to the prompt's end: it prefills every time)
        once = check.tokens <= target_p.meta["max_chunk"] and not target_p.meta.get("recurrent_state")
        target = PrefillOnce(target_p, len(ids)) if once else target_p
        reference = _per_position_counts([generate_ar(target, ids, check.tokens, eos, max_seq_len, chunk,
                                            sampler=Sampler(check.settings("argmax", seed + i))).tokens
                                for i in range(check.samples)], check.tokens)
        for m, proposals in enumerate(PROPOSALS, start=1):
            settings = check.settings(proposals, seed + m * check.samples)
            runs = [generate_dflash(target, draft_p, ids, check.tokens, eos, max_seq_len, chunk, block,
                                    mask_token_id, sampler=Sampler(replace(settings, seed=settings.seed + i))).tokens
                    for i in range(check.samples)]
            for position, (a, b) in enumerate(zip(_per_position_counts(runs, check.tokens), reference), start=2):
                _, _, p = chi_square(a, b)
                tests += 1
                max_tv = max(max_tv, total_variation(a, b))
                if p < worst_p or worst_where is None:
                    worst_p, worst_where = p, f"{label}, {proposals} proposals, generated token {position}"
    return {"settings": {**check.settings("argmax", check.seed).settings(), "proposals": list(PROPOSALS)},
            "samples": check.samples, "tokens": check.tokens, "block_size": block, "tests": tests,
            "min_p_value": worst_p, "where": worst_where, "threshold": check.alpha / tests,
            "max_total_variation": max_tv, "same_distribution": worst_p >= check.alpha / tests}
