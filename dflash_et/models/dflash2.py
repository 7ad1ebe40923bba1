"""DFlash2's two additions to the draft (z-lab's `dflash` 0.1.0, `DFlash2DraftModel`), as parts it is built with.

`GroupedCausalConv` mixes each block row with the rows before it in its block: around attention and around
the MLP of every layer, a causal convolution over the block whose kernel is a learned base per channel plus
an input-dependent part per channel group. It never reaches across a block's start, so a block's first row
(the anchor) sees itself alone, as in z-lab's model, which zero-pads each block.

`CandidateSelector` chooses the proposals from the top-k tokens of each block position instead of taking
each position's argmax: a candidate's score is its logit plus a low-rank predecessor/successor term, and the
path through the block is walked left to right, each position's predecessor the token chosen before it (the
anchor first). The walk is sequential and the block length varies, so the draft returns the scores as a
lattice (runtime.sampling.Lattice) and `walk` runs on the host: one top-k and one batched product in the
graph, a k-way choice per position outside it.
"""

import torch
import torch.nn.functional as F
from torch import nn


def convolve(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group: int,
             rows_see: torch.Tensor | None) -> torch.Tensor:
    """`x` [1, R, H] convolved causally over rows: row r gets sum over o of (base[o] + dynamic[r, o]) * x[r - o],
    `dynamic` [1, R, K, H / group] per channel group. `rows_see` [R, R] (training's packed blocks: which rows
    share a block) cuts the sum at each block's start; None: the rows are one block."""
    r, h = x.shape[1], x.shape[2]

    def tap(rows: torch.Tensor, o: int) -> torch.Tensor:
        # the group's factor broadcast over its channels, not copied out to every channel (a copy per tap cost
        # the exported draft more than its convolutions' products)
        grouped = rows.reshape(1, r, h // group, group) * dynamic[:, :, o, :, None]
        return rows * base[o] + grouped.reshape(1, r, h)

    out = tap(x, 0)
    for o in range(1, base.shape[0]):
        shifted = F.pad(x, (0, 0, o, 0))[:, :r]  # row r holds x[r - o], zeros before the first row
        if rows_see is not None:  # and zeros where row r - o is in another block
            same = F.pad(torch.diagonal(rows_see, -o), (o, 0)).to(x.dtype)
            shifted = shifted * same[None, :, None]
        out = out + tap(shifted, o)
    return out


class GroupedCausalConv(nn.Module):
    """z-lab's `GroupedDynamicCausalConv`: `prepare` convolves a branch's input with the first kernel and keeps
    the second's dynamic part, which `finish` applies to the branch's output (both from the input's rows)."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} does not divide the draft's hidden size {hidden_size}")
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * (hidden_size // group_size), bias=False)

    def prepare(self, h: torch.Tensor, rows_see: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        dynamic = self.kernel_projection(h).view(1, h.shape[1], 2, self.kernel_size, -1)
        return convolve(h, dynamic[:, :, 0], self.base_kernel[0], self.group_size, rows_see), dynamic[:, :, 1]

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor, rows_see: torch.Tensor | None) -> torch.Tensor:
        return convolve(y, dynamic, self.base_kernel[1], self.group_size, rows_see)


class Unconvolved(nn.Module):
    """A DFlash draft layer's stand-in for `GroupedCausalConv`: both steps pass their input through."""

    def prepare(self, h: torch.Tensor, rows_see: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        return h, None

    def finish(self, y: torch.Tensor, dynamic: None, rows_see: torch.Tensor | None) -> torch.Tensor:
        return y


class CandidateSelector(nn.Module):
    """z-lab's `CandidateSelector`, its weights under z-lab's names."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def pairwise(self, hidden: torch.Tensor, before: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """The low-rank score [P, m, k] of each position's k `candidates` [P, k] after each of its m predecessors
        `before` [P, m], at the positions' normed hidden states `hidden` [P, H]."""
        pred = self.predecessor_codebook(before) * self.hidden_projection(hidden)[:, None, :]  # [P, m, r]
        return pred @ self.successor_codebook(candidates).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
                vocab_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """`hidden` [1, P, H] (the draft's normed output) and `logits` [1, P, V] of the proposal positions (over
        `vocab_ids` when the head was reduced), `anchor` [1] the block's first token -> the lattice's tensors
        (runtime.sampling.Lattice), its candidates token ids."""
        unary, candidates = torch.topk(logits[0], self.top_k, dim=-1)  # [P, k]
        candidates = candidates if vocab_ids is None else vocab_ids[candidates]
        # [P, k] each position's predecessors; an explicit end (the MLX partitioner rejects open slices)
        before = torch.cat([anchor.expand(1, self.top_k), candidates])[:candidates.shape[0]]
        return candidates, unary, self.pairwise(hidden[0], before, candidates)

    def teacher_forced(self, hidden: torch.Tensor, logits: torch.Tensor, before: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training's scores: each row's top-k candidates [R, k] and their scores [R, k] after its true predecessor
        `before` [R] (the anchor, then the target's tokens), as the walk scores them."""
        unary, candidates = torch.topk(logits, self.top_k, dim=-1)
        return candidates, unary + self.pairwise(hidden, before[:, None], candidates)[:, 0]
