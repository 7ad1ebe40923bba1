"""z-lab's DFlash draft: one definition for inference (cached, exported) and training (dense, masked).

`forward(tokens [1,B], hidden [1,n,k*H], input_pos [n]) -> logits [1,B-1,V]` (over `vocab_ids` when its head
was reduced: `reduce_head`): the n new context
taps are written to the draft's own cache (it persists across rounds); the block `[last token,
mask x (B-1)]` is written right after them and attends to the whole context and to itself, not
causally. The next call's context overwrites those block entries. Positions must be consecutive.

A draft whose every layer has a window (`context_window`) never reads a tap older than its block's first
position minus window - 1: decode loops leave such taps out, so a call takes at most window - 1 of them,
and with `ring` the windowed layers' caches are ring buffers sized for such calls (models.attention).

Training passes many blocks at once: `block_pos` (each block row's position) and `block_mask`
[rows, n + rows] (which context and block rows each row may see); the cache is then left alone
and logits come back for the rows in `logit_rows` (default: every row). The head is most of a
training step's cost for a real vocabulary, so rows that carry no loss skip it. A DFlash2 draft given each
logit row's true predecessor (`before`) also returns its selector's candidates and scores for the loss (a
DFlash draft ignores `before`).

A DFlash2 draft (`conv`, `selector`: models.dflash2) convolves each block causally in every layer and, in
decoding, returns its proposal positions' candidate lattice (candidates, unary, pair) instead of the logits.
"""

import torch
from torch import nn

from dflash_et.models.block import Block, ModelArgs, Rope, scale_embedding, softcap, start_position
from dflash_et.models.dflash2 import CandidateSelector
from dflash_et.models.layers import RMSNorm


class Draft(nn.Module):
    """The draft's own layers, with the target's embedding and head (borrowed, see checkpoints.zlab)."""

    def __init__(self, a: ModelArgs, rope: dict[str, tuple[torch.Tensor, torch.Tensor]], num_taps: int,
                 target_hidden: int, logit_scale: float = 1.0, ops: str = "torch", max_block: int | None = None,
                 ring: bool = False, conv: tuple[int, int] | None = None, selector: tuple[int, int] | None = None):
        """`max_block`: the longest block a call takes; with it, `ring` gives a windowed draft's layers ring
        buffers of window + max_block - 1 rows (models.attention.ring_rows with the block as the longest call):
        the block's queries see the window before them, a call's at most window - 1 taps and block fit without
        wrapping onto themselves, and as long as no call's block starts before the previous call's (decoding
        never does), the rows of the previous block that a shorter one leaves hold positions outside every
        query's window. `conv` (kernel, group size) and `selector` (rank, top-k): DFlash2's parts."""
        super().__init__()
        self.rope = Rope(rope)
        self.args, self.max_seq_len, self.logit_scale = a, self.rope.max_seq_len, logit_scale
        self.embed_tokens = nn.Embedding(a.vocab_size, target_hidden)
        self.lm_head = nn.Linear(target_hidden, a.vocab_size, bias=False)
        self.fc = nn.Linear(num_taps * target_hidden, a.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.layers = nn.ModuleList(Block(a, spec, self.max_seq_len, ops, max_block if self.context_window else None,
                                          ring=ring, conv=conv) for spec in a.layers)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        # the token id of each of the head's rows when `reduce_head` kept some (None: the vocabulary's, in order)
        self.register_buffer("vocab_ids", None, persistent=False)
        if selector is not None:
            self.candidate_selector = CandidateSelector(a.hidden_size, a.vocab_size, *selector)

    @property
    def context_window(self) -> int | None:
        """How far back the draft reads its context when every layer has a window (the widest), else None."""
        windows = [spec.window for spec in self.args.layers]
        return max(windows) if windows and None not in windows else None

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor,
                block_pos: torch.Tensor | None = None, block_mask: torch.Tensor | None = None,
                logit_rows: torch.Tensor | None = None, before: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        n, b = hidden.shape[1], tokens.shape[1]
        if block_mask is None:
            start = start_position(input_pos, n + b, self.max_seq_len)
            block_pos = torch.arange(b, dtype=torch.long) + (start + n)
        else:
            start = 0  # training: nothing is cached
        positions = torch.cat([input_pos, block_pos])
        rope = self.rope(positions)
        ctx = self.hidden_norm(self.fc(hidden))
        x = scale_embedding(self.embed_tokens(tokens), self.args.embed_scale)
        for layer in self.layers:
            x = layer(x, rope, start, positions, ctx, block_mask)
        if block_mask is None:
            x = x[:, 1:b]  # the anchor's row predicts nothing; explicit end, as in Attention
        elif logit_rows is not None:
            x = x[:, logit_rows]
        x = self.norm(x)
        logits = self.lm_head(x)
        if self.logit_scale != 1.0:  # a full-vocabulary multiply (and its gradient) saved when it is none
            logits = logits * self.logit_scale
        logits = softcap(logits, self.args.logit_softcap)
        if block_mask is None and hasattr(self, "candidate_selector"):
            return self.candidate_selector(x, logits, tokens[0, :1], self.vocab_ids)
        if before is not None and hasattr(self, "candidate_selector"):  # training a DFlash2 draft: its scores too
            return (logits, *self.candidate_selector.teacher_forced(x[0], logits[0], before))
        return logits


def reduce_head(draft: Draft, ids: list[int]) -> None:
    """`export.draft_vocab`: the draft scores only the tokens `ids` (its own copy of those rows of the borrowed
    head) and returns their N logits, `vocab_ids` saying whose they are: the runners read a proposal's token id
    there. Placing them back in the vocabulary inside the program (a scatter into a [B-1, V] fill) cost as much
    as the smaller head saved from 16k rows up (docs/measurements.md#a-draft-head-over-the-tokens-the-target-emits)."""
    weight, kept = draft.lm_head.weight, torch.tensor(ids)
    draft.lm_head = nn.Linear(weight.shape[1], len(ids), bias=False, dtype=weight.dtype)
    draft.lm_head.weight = nn.Parameter(weight.detach()[kept].clone(), requires_grad=False)
    draft.vocab_ids = kept
