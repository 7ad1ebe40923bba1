"""z-lab's DFlash draft: one definition for inference (cached, exported) and training (dense, masked).

`forward(tokens [1,B], hidden [1,n,k*H], input_pos [n]) -> logits [1,B-1,V]` (over `vocab_ids` when its head
was reduced: `reduce_head`): the n new context
taps are written to the draft's own cache (it persists across rounds); the block `[last token,
mask x (B-1)]` is written right after them and attends to the whole context and to itself, not
causally. The next call's context overwrites those block entries. Positions must be consecutive.

A draft whose every layer has a window (`context_window`) never reads a tap older than its block's first
position minus window - 1: decode loops leave such taps out, so a call takes at most window - 1 of them,
and with `ring` the windowed layers' caches are ring buffers sized for such calls (models.attention).

Training calls `packed` instead: many blocks at once, each block row at its own position (`block_pos`), with
`mask` [rows, n + rows] saying which context and block rows each row may see; the cache is then left alone and
logits come back for the rows in `logit_rows` alone. The head is most of a training step's cost for a real
vocabulary, so rows that carry no loss skip it.

`DFlash2Draft` (models.dflash2's parts) convolves each block causally in every layer and, in decoding, returns
its proposal positions' candidate lattice (candidates, unary, pair) instead of the logits (`returns_lattice`).
"""

import torch
from torch import nn

from dflash_et.models.attention import AttentionSpec, RopeRows, Segmented
from dflash_et.models.block import ModelArgs, Rope, add_mlp, attention, scale_embedding, softcap, start_position
from dflash_et.models.dflash2 import CandidateSelector, GroupedCausalConv, Unconvolved
from dflash_et.models.layers import RMSNorm


class DraftBlock(nn.Module):
    """A draft layer (Qwen3's pre-norm form): K/V also cover the un-normed context rows `ctx`. `conv` (kernel size,
    group size): a DFlash2 draft layer's causal convolutions over the block around attention and around the MLP
    (models.dflash2); without, pass-throughs."""

    def __init__(self, a: ModelArgs, spec: AttentionSpec, max_seq_len: int, ops: str, max_call: int | None,
                 ring: bool, conv: tuple[int, int] | None):
        super().__init__()
        self.attention_conv = Unconvolved() if conv is None else GroupedCausalConv(a.hidden_size, *conv)
        self.mlp_conv = Unconvolved() if conv is None else GroupedCausalConv(a.hidden_size, *conv)
        self.self_attn = attention(a, spec, max_seq_len, ops, max_call, ring)
        add_mlp(self, a)

    def forward(self, x: torch.Tensor, rope: dict[str, RopeRows], start: int,
                positions: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Decoding: the rows of `x` are one block, after the context; both are cached."""
        return self._layer(x, rope, start, positions, ctx, None, None)

    def packed(self, x: torch.Tensor, rope: dict[str, RopeRows], positions: torch.Tensor,
               ctx: torch.Tensor, mask: torch.Tensor, segments: tuple | None = None) -> torch.Tensor:
        """Training: the rows of `x` are many blocks, `mask` [rows, context + rows] what each row sees, `segments`
        (models.attention.Segmented) where each sequence's rows are, if given; nothing is cached."""
        seen = mask if segments is None else Segmented(mask, segments)
        return self._layer(x, rope, 0, positions, ctx, seen, mask[:, ctx.shape[1]:])

    def _layer(self, x: torch.Tensor, rope: dict[str, RopeRows], start: int,
               positions: torch.Tensor, ctx: torch.Tensor, mask: torch.Tensor | Segmented | None,
               rows_see: torch.Tensor | None) -> torch.Tensor:
        h, kernel = self.attention_conv.prepare(self.input_layernorm(x), rows_see)
        attn = self.self_attn(h, torch.cat([ctx, h], dim=1), rope, start, positions, mask)
        x = x + self.attention_conv.finish(attn, kernel, rows_see)
        h, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(x), rows_see)
        return x + self.mlp_conv.finish(self.mlp(h), kernel, rows_see)


class Draft(nn.Module):
    """The draft's own layers, with the target's embedding and head (borrowed, see checkpoints.zlab)."""

    returns_lattice = False  # what `forward` returns: logits (a DFlash2Draft's: a lattice), for the decode loop

    def __init__(self, a: ModelArgs, rope: dict[str, tuple[torch.Tensor, torch.Tensor]], num_taps: int,
                 target_hidden: int, logit_scale: float = 1.0, ops: str = "torch", max_block: int | None = None,
                 ring: bool = False, conv: tuple[int, int] | None = None):
        """`max_block`: the longest block a call takes; with it, `ring` gives a windowed draft's layers ring
        buffers of window + max_block - 1 rows (models.attention.ring_rows with the block as the longest call):
        the block's queries see the window before them, a call's at most window - 1 taps and block fit without
        wrapping onto themselves, and as long as no call's block starts before the previous call's (decoding
        never does), the rows of the previous block that a shorter one leaves hold positions outside every
        query's window. `conv` (kernel, group size): DFlash2's convolutions (DraftBlock)."""
        super().__init__()
        self.rope = Rope(rope)
        self.args, self.max_seq_len, self.logit_scale = a, self.rope.max_seq_len, logit_scale
        self.embed_tokens = nn.Embedding(a.vocab_size, target_hidden)
        self.lm_head = nn.Linear(target_hidden, a.vocab_size, bias=False)
        self.fc = nn.Linear(num_taps * target_hidden, a.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.layers = nn.ModuleList(DraftBlock(a, spec, self.max_seq_len, ops,
                                               max_block if self.context_window else None, ring, conv)
                                    for spec in a.layers)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        # the token id of each of the head's rows when `reduce_head` kept some (None: the vocabulary's, in order)
        self.register_buffer("vocab_ids", None, persistent=False)

    @property
    def context_window(self) -> int | None:
        """How far back the draft reads its context when every layer has a window (the widest), else None."""
        windows = [spec.window for spec in self.args.layers]
        return max(windows) if windows and None not in windows else None

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Decoding (eager and exported): the logits [1, B-1, V] of the block's proposal positions."""
        return self.proposal_states(tokens, hidden, input_pos)[1]

    def proposal_states(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposal positions' normed hidden states [1, B-1, H] and logits: decoding's call."""
        n, b = hidden.shape[1], tokens.shape[1]
        start = start_position(input_pos, n + b, self.max_seq_len)
        positions = torch.cat([input_pos, torch.arange(b, dtype=torch.long) + (start + n)])
        rope, ctx, x = self.inputs(tokens, hidden, positions)
        for layer in self.layers:
            x = layer(x, rope, start, positions, ctx)
        x = self.norm(x[:, 1:b])  # the anchor's row predicts nothing; explicit end, as in Attention
        return x, self.head(x)

    def packed(self, tokens: torch.Tensor, hidden: torch.Tensor, ctx_pos: torch.Tensor, block_pos: torch.Tensor,
               mask: torch.Tensor, logit_rows: torch.Tensor, segments: tuple | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training's call (module docstring): the `logit_rows`' normed hidden states [1, R, H] and logits;
        `segments`: where each sequence's rows are (training.blocks.Batch), which makes attention per sequence."""
        positions = torch.cat([ctx_pos, block_pos])
        rope, ctx, x = self.inputs(tokens, hidden, positions)
        for layer in self.layers:
            x = layer.packed(x, rope, positions, ctx, mask, segments)
        x = self.norm(x[:, logit_rows])
        return x, self.head(x)

    def inputs(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
               ) -> tuple[dict[str, RopeRows], torch.Tensor, torch.Tensor]:
        """What the layers take: the RoPE tables at `positions` (the context's, then the blocks'), the context rows
        made from the taps, and the blocks' embedded tokens."""
        rope = self.rope(positions)  # in this order: the order of the exported program's ops
        ctx = self.hidden_norm(self.fc(hidden))
        return rope, ctx, scale_embedding(self.embed_tokens(tokens), self.args.embed_scale)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of the normed hidden states `x`: the (borrowed) head, its scale and softcap."""
        logits = self.lm_head(x)
        if self.logit_scale != 1.0:  # a full-vocabulary multiply (and its gradient) saved when it is none
            logits = logits * self.logit_scale
        return softcap(logits, self.args.logit_softcap)


class DFlash2Draft(Draft):
    """A DFlash2 draft (z-lab's `DFlash2DraftModel`): convolutions in every layer (`conv`) and a candidate selector
    (`selector`: rank, top-k), whose lattice decoding walks (models.dflash2)."""

    returns_lattice = True

    def __init__(self, a: ModelArgs, rope: dict[str, tuple[torch.Tensor, torch.Tensor]], num_taps: int,
                 target_hidden: int, logit_scale: float, ops: str, max_block: int | None, ring: bool,
                 conv: tuple[int, int], selector: tuple[int, int]):
        super().__init__(a, rope, num_taps, target_hidden, logit_scale, ops, max_block, ring, conv)
        self.candidate_selector = CandidateSelector(a.hidden_size, a.vocab_size, *selector)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decoding (eager and exported): the proposal positions' lattice (candidates, unary, pair)."""
        x, logits = self.proposal_states(tokens, hidden, input_pos)
        return self.candidate_selector(x, logits, tokens[0, :1], self.vocab_ids)


def reduce_head(draft: Draft, ids: list[int]) -> None:
    """`export.draft_vocab`: the draft scores only the tokens `ids` (its own copy of those rows of the borrowed
    head) and returns their N logits, `vocab_ids` saying whose they are: the runners read a proposal's token id
    there. Placing them back in the vocabulary inside the program (a scatter into a [B-1, V] fill) cost as much
    as the smaller head saved from 16k rows up (docs/measurements.md#a-draft-head-over-the-tokens-the-target-emits)."""
    weight, kept = draft.lm_head.weight, torch.tensor(ids)
    draft.lm_head = nn.Linear(weight.shape[1], len(ids), bias=False, dtype=weight.dtype)
    draft.lm_head.weight = nn.Parameter(weight.detach()[kept].clone(), requires_grad=False)
    draft.vocab_ids = kept
