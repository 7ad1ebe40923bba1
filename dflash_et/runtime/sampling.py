"""Choosing tokens: greedy, sampling, and the speculative-sampling rule that keeps DFlash exact.

At temperature > 0 the target's distribution `p` at each verified position and the draft's `q`
at each proposal go through the same processing (temperature, then top-k, then top-p, as
transformers' `generate` orders its warpers). A proposal `x` is accepted with probability
`min(1, p(x) / q(x))`; at the first rejection the next token is drawn from
`normalize(max(0, p - q))`, and after a fully accepted block the bonus is drawn from `p`. Each
emitted token then has exactly the target's distribution (Leviathan et al. 2023; Chen et al.
2023), whatever the draft proposes. With argmax proposals `q` is one-hot at `x`: the rule
becomes "accept with probability p(x), else draw from p with x removed". A DFlash2 draft proposes its
path through a lattice of candidates (`Sampler.walk`): each position's q is its distribution over its candidates
after the proposal before it, which the rule takes as it takes any q (the walk is the C++ runner's, `native.walk`).

Every draw comes from one seeded `torch.Generator`, so a seed fixes the tokens on given programs.
"""

import math
from dataclasses import dataclass, replace

import torch

from dflash_et.runtime import native

PROPOSALS = ("argmax", "sample")  # how the draft's block becomes proposals at temperature > 0


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. temperature 0 is greedy (top_k, top_p and seed then do nothing)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None    # None (or 0 in program metadata): no top-k
    proposals: str = "argmax"   # argmax | sample: the draft's proposals at temperature > 0 (both exact)
    seed: int = 0

    def __post_init__(self):
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be 0 (greedy) or a positive number, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; 1 turns top-p off")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}; leave it unset to turn top-k off")
        if self.proposals not in PROPOSALS:
            raise ValueError(f"proposals must be one of {', '.join(PROPOSALS)}, got {self.proposals!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def settings(self) -> dict:
        """What a report says it ran with."""
        if self.greedy:
            return {"temperature": 0.0}
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "proposals": self.proposals, "seed": self.seed}

    @classmethod
    def from_metadata(cls, meta: dict, **overrides) -> "Sampling":
        """The checkpoint's recommended settings, as target.pte carries them, with `overrides` on top."""
        recommended = cls(temperature=meta["temperature"], top_p=meta["top_p"], top_k=meta["top_k"] or None)
        return replace(recommended, **{k: v for k, v in overrides.items() if v is not None})


def distribution(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Probabilities [..., V] after temperature, top-k and top-p (transformers' warpers, in their order)."""
    scores = logits.float() / s.temperature
    if s.top_k is not None and s.top_k < scores.shape[-1]:
        top, index = torch.topk(scores, s.top_k, dim=-1)
        if bool(((scores >= top[..., -1:]).sum(-1) == s.top_k).all()):  # no ties with the k-th: only k candidates
            probs = top.softmax(-1)
            probs = nucleus(probs, s.top_p) if s.top_p < 1 else probs
            return torch.zeros_like(scores).scatter(-1, index, probs)
        scores = scores.masked_fill(scores < top[..., -1:], float("-inf"))  # ties with the k-th stay, as in transformers
    probs = scores.softmax(-1)
    return nucleus(probs, s.top_p) if s.top_p < 1 else probs


def nucleus(probs: torch.Tensor, top_p: float, head: int = 64) -> torch.Tensor:
    """Top-p: a token stays while the tokens sorted before it (most likely first) hold less than top_p.

    Only the most likely `head` tokens are sorted, `head` growing until they hold top_p: sorting a
    real vocabulary (150k tokens) per verified position would cost more than the verify call.
    """
    vocab = probs.shape[-1]
    while True:
        top, index = probs.topk(min(head, vocab), dim=-1)
        if head >= vocab or bool((top.cumsum(-1)[..., -1] >= top_p).all()):  # the sum the keep test sees
            break
        head *= 4
    keep = top * (top.cumsum(-1) - top < top_p)
    kept = torch.zeros_like(probs).scatter(-1, index, keep)
    return kept / kept.sum(-1, keepdim=True)


def acceptance(p: torch.Tensor, q: torch.Tensor | None, x: int) -> float:
    """Probability of accepting proposal x: min(1, p(x)/q(x)); p(x) when q is None (an argmax proposal)."""
    if q is None:
        return float(p[x])
    return min(1.0, float(p[x] / q[x]))


def residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """The distribution to draw from once x is rejected: normalize(max(0, p - q)), q one-hot at x when None.

    Where it has no mass (p == q, or p one-hot at x) rejection has probability 0: p is returned
    so that rounding in `acceptance` can never divide by zero.
    """
    if q is None:
        rest = p.clone()
        rest[x] = 0
    else:
        rest = (p - q).clamp_min(0)
    total = rest.sum()
    return rest / total if total > 0 else p


def argmax(logits: torch.Tensor) -> list[int] | int:
    """The most likely token of each row (the first on ties, as torch.argmax): numpy's is 10x faster on a
    CPU than torch's for a block of rows, and it runs on the host between every two program calls."""
    return logits.detach().float().numpy().argmax(-1).tolist()


@dataclass
class Lattice:
    """A block's candidates and their scores: `candidates` and `unary` (their logits) [P, k] for the P proposal
    positions; `pair` [P, k, k]: the pairwise score of candidate i at position p after candidate j of position
    p - 1 (at p = 0 after the anchor, the same for every j)."""

    candidates: torch.Tensor
    unary: torch.Tensor
    pair: torch.Tensor


class Sampler:
    """Chooses the tokens of one or more generations: greedily, or by sampling with a seeded generator."""

    def __init__(self, sampling: Sampling = Sampling()):
        self.sampling = sampling
        self.generator = torch.Generator().manual_seed(sampling.seed)

    def _draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def next_token(self, logits: torch.Tensor) -> int:
        """A token from the target's logits [V] (plain decoding, and the token after prefill)."""
        if self.sampling.greedy:
            return argmax(logits)
        return self._draw(distribution(logits, self.sampling))

    def propose(self, draft_logits: torch.Tensor, vocab_ids: torch.Tensor | None = None, vocab_size: int = 0
                ) -> tuple[list[int], torch.Tensor | None]:
        """Proposals from the draft's logits [n, V], and the distributions q [n, V] they were drawn from
        (None for argmax proposals, whose q is one-hot). A reduced head's logits [n, N] are those of the tokens
        `vocab_ids` (models.draft.reduce_head): q is zero elsewhere in the vocabulary of `vocab_size`, so
        verifying stays exact."""
        if self.sampling.greedy or self.sampling.proposals == "argmax":
            best = argmax(draft_logits)
            return best if vocab_ids is None else vocab_ids[best].tolist(), None
        q = distribution(draft_logits, self.sampling)
        drawn = torch.multinomial(q, 1, generator=self.generator)[:, 0]
        if vocab_ids is None:
            return drawn.tolist(), q
        return vocab_ids[drawn].tolist(), q.new_zeros(len(q), vocab_size).index_copy_(1, vocab_ids, q)

    def walk(self, lattice: Lattice, vocab_size: int) -> tuple[list[int], torch.Tensor | None, torch.Tensor]:
        """A DFlash2 draft's proposals: its path through `lattice` as the runner's sampler walks it (`native.walk`:
        at each position the best-scoring candidate after the one chosen before it, or one drawn from
        softmax(score / temperature) for sampled proposals, as z-lab's `select`), its draws seeded from this
        sampler's generator; their q [P, V] (each position's distribution over its candidates; None for greedy) and
        the scores [P, k] each choice was made from."""
        sampled = not self.sampling.greedy and self.sampling.proposals == "sample"
        seed = int(torch.randint(0, 2**62, (), generator=self.generator)) if sampled else 0
        return native.walk(lattice.candidates, lattice.unary, lattice.pair, vocab_size, self.sampling.temperature,
                           sampled, seed)

    def verify(self, proposals: list[int], q: torch.Tensor | None, logits: torch.Tensor) -> tuple[int, int]:
        """(accepted, next): how many proposals the target's logits [n+1, V] accept, and the token after them."""
        if self.sampling.greedy:
            verified = argmax(logits)
            accepted = 0
            while accepted < len(proposals) and proposals[accepted] == verified[accepted]:
                accepted += 1
            return accepted, verified[accepted]
        for i, x in enumerate(proposals):  # p row by row: rows after a rejection are never needed
            p, q_i = distribution(logits[i], self.sampling), None if q is None else q[i]
            if float(torch.rand((), generator=self.generator)) >= acceptance(p, q_i, x):
                return i, self._draw(residual(p, q_i, x))
        return len(proposals), self._draw(distribution(logits[len(proposals)], self.sampling))
