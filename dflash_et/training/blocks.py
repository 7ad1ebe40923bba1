"""A training step's data: blocks of anchors drawn from the target's replies, packed into one `Draft.packed`
call with the visibility each row has in decoding, and the loss on them (`draft_loss`).

Per sequence, anchor positions are sampled; each training block is `[anchor token, mask x (B-1)]` at the
anchor's positions, whose rows see the target taps of the positions before the anchor and the whole block
(bidirectional inside the block, nothing after it). The loss is cross-entropy on the B-1 masked positions,
position k weighted by exp(-(k-1)/gamma): early positions matter most, since a block is accepted left to right.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_et.models.draft import DFlash2Draft, Draft
from dflash_et.training.data import Sequence


@dataclass
class Batch:
    """Every block of several sequences, packed into one `Draft.packed` call, on the taps' device."""

    tokens: torch.Tensor          # [1, R] block rows: anchor token, then masks
    hidden: torch.Tensor          # [1, C, k*H] the sequences' taps, one after another
    ctx_pos: torch.Tensor         # [C] each tap's position in its own sequence
    block_pos: torch.Tensor       # [R] each block row's position in its own sequence
    mask: torch.Tensor            # [R, C + R] what each row may see
    labels: torch.Tensor          # [R] the token each row should predict (-100: none)
    weights: torch.Tensor         # [R] loss weight of each row
    before: torch.Tensor          # [R] the token before each row's label (the anchor, then the labels): DFlash2
    rows: torch.Tensor            # the rows with a weight, the only ones that get logits (found on the host)
    segments: tuple[tuple[int, int, int, int], ...] | None = None  # each sequence's block rows and taps (start, end,
    # start, end): attention one sequence at a time (None: one dense masked product)


def sample_anchors(seq: Sequence, n: int, gen: torch.Generator) -> torch.Tensor:
    """Anchor positions where decoding actually happens: from the last prompt token to the one before the end."""
    low, high = max(seq.prompt_len - 1, 1), len(seq.tokens) - 2
    if high < low:
        return torch.empty(0, dtype=torch.long)
    return torch.randint(low, high + 1, (n,), generator=gen).unique()


def loss_weights(block: int, gamma: float) -> torch.Tensor:
    """exp(-(k-1)/gamma) for the masked positions k = 1..B-1."""
    return torch.exp(-(torch.arange(1, block, dtype=torch.float32) - 1) / gamma)


def read_span(anchors: torch.Tensor, window: int | None) -> tuple[int, int]:
    """The taps a sequence's blocks read: those before its last anchor, and, under a context `window`, no older
    than its first anchor's window. Packing only these keeps a long prompt's step as cheap as a short one's."""
    if not len(anchors):
        return 0, 0
    low = 0 if window is None else max(int(anchors.min()) - window + 1, 0)
    return low, int(anchors.max())


def pack(seqs: list[Sequence], anchors: list[torch.Tensor], block: int, mask_token_id: int, gamma: float,
         window: int | None = None) -> Batch:
    """One batch of blocks: a row of anchor i of sequence s sees the taps of s before the anchor and block i
    (within `window` of it: the draft's `context_window`; only the taps some row reads are packed). The indices are
    made on the host, the taps and the mask on the taps' device: nothing is read back from it."""
    device = seqs[0].taps.device
    spans = [read_span(a, window) for a in anchors]
    ctx_seq = torch.cat([torch.full((high - low,), i) for i, (low, high) in enumerate(spans)])
    ctx_pos = torch.cat([torch.arange(low, high) for low, high in spans])
    rows = [(i, a) for i, a_s in enumerate(anchors) for a in a_s.tolist()]
    row_seq = torch.tensor([i for i, _ in rows]).repeat_interleave(block)
    row_anchor = torch.tensor([a for _, a in rows]).repeat_interleave(block)
    row_block = torch.arange(len(rows)).repeat_interleave(block)
    offset = torch.arange(block).repeat(len(rows))
    tokens = torch.full((len(rows) * block,), mask_token_id)
    labels = torch.full((len(rows) * block,), -100)
    for r, (i, a) in enumerate(rows):
        seq = seqs[i].tokens
        tokens[r * block] = seq[a]
        end = min(a + block, len(seq))
        labels[r * block + 1:r * block + 1 + end - a - 1] = seq[a + 1:end]
    weights = torch.cat([torch.zeros(1), loss_weights(block, gamma)]).repeat(len(rows)) * (labels >= 0)
    hidden = torch.cat([s.taps[low:high] for s, (low, high) in zip(seqs, spans)])
    before = torch.where(offset == 1, tokens.roll(1), labels.roll(1)).clamp(min=0)  # row 0 and past-the-end: unused
    ctx_seq, ctx_pos, row_seq, row_anchor, row_block = (t.to(device) for t in (ctx_seq, ctx_pos, row_seq, row_anchor,
                                                                                 row_block))
    sees_ctx = (ctx_seq[None, :] == row_seq[:, None]) & (ctx_pos[None, :] < row_anchor[:, None])
    sees_block = row_block[:, None] == row_block[None, :]
    row_ends = torch.tensor([len(a) * block for a in anchors]).cumsum(0).tolist()
    ctx_ends = torch.tensor([high - low for low, high in spans]).cumsum(0).tolist()
    segments = tuple((r1 - len(a) * block, r1, c1 - (high - low), c1)
                     for a, (low, high), r1, c1 in zip(anchors, spans, row_ends, ctx_ends) if len(a))
    return Batch(tokens[None].to(device), hidden[None], ctx_pos, row_anchor + offset.to(device),
                 torch.cat([sees_ctx, sees_block], dim=1), labels.to(device), weights.to(device), before.to(device),
                 weights.nonzero().squeeze(1).to(device), segments)


class DraftLoss(torch.nn.Module):
    """Position-weighted cross-entropy of the draft's predictions for every masked row of a batch. Only rows with
    a weight get logits: anchors and rows past a reply's end skip the head. A module whose `forward` is the loss,
    so that DistributedDataParallel can wrap it (it syncs the gradients of what `forward` computes)."""

    def __init__(self, draft: Draft):
        super().__init__()
        self.draft = draft

    def forward(self, batch: Batch) -> torch.Tensor:
        rows = batch.rows
        hidden, logits = self.draft.packed(batch.tokens, batch.hidden, batch.ctx_pos, batch.block_pos, batch.mask, rows,
                                           batch.segments)
        labels, weights = head_labels(self.draft, batch.labels[rows]), batch.weights[rows]
        weights = weights * (labels >= 0)  # a label outside a reduced head: the draft can never propose it
        total = self.weighted_sum(hidden[0], logits[0], labels, weights, batch.before[rows])
        return total / weights.sum().clamp(min=1e-9)

    def weighted_sum(self, hidden: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     before: torch.Tensor) -> torch.Tensor:
        """The rows' weighted losses, summed: `hidden` [R, H] and `logits` [R, V] the draft's, `before` [R] each
        label's predecessor."""
        return (F.cross_entropy(logits.float(), labels, reduction="none") * weights).sum()


class DFlash2Loss(DraftLoss):
    """A DFlash2 draft's: the token loss plus its selector's cross-entropy over each row's top-k candidates, scored
    after the true predecessor (teacher forcing), with the same weights and denominator: the objective of the
    public reproductions (SpecForge, vLLM speculators, NeMo; z-lab publishes none). A row whose label is not among
    its candidates adds nothing to it: the selector cannot choose it, the token loss must bring it in."""

    def weighted_sum(self, hidden: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     before: torch.Tensor) -> torch.Tensor:
        candidates, scores = self.draft.candidate_selector.teacher_forced(hidden, logits, before)
        hit = candidates == labels[:, None]
        chosen = F.cross_entropy(scores.float(), hit.int().argmax(-1), reduction="none")
        return super().weighted_sum(hidden, logits, labels, weights, before) + (chosen * weights * hit.any(-1)).sum()


def head_labels(draft: Draft, labels: torch.Tensor) -> torch.Tensor:
    """Token ids as rows of the draft's head: themselves for a full head, their place among `vocab_ids` for a
    reduced one (train_draft.head_vocab), -100 for a token it does not score."""
    if draft.vocab_ids is None:
        return labels
    place = torch.full((draft.args.vocab_size,), -100, dtype=torch.long, device=labels.device)
    place[draft.vocab_ids.to(labels.device)] = torch.arange(len(draft.vocab_ids), device=labels.device)
    return torch.where(labels >= 0, place[labels.clamp(min=0)], labels)


def block_tau(draft: Draft, seqs: list[Sequence], block: int, mask_token_id: int) -> float:
    """1 + the accepted run of one block call at every anchor of `seqs` (held-out prompts with the target's greedy
    replies and taps), averaged: the proposals greedy DFlash would verify there, matched against what the target
    said. One batched pass a sequence, no decoding loop: cheap enough to watch a run with. Decoding visits only
    the anchors its rounds reach, so its tau weighs them otherwise; the full decode measures that (`heldout_tau`)."""
    runs = []
    with torch.no_grad():
        for seq in seqs:
            anchors = torch.arange(max(seq.prompt_len - 1, 1), len(seq.tokens) - 1)
            if not len(anchors):
                continue
            batch = pack([seq], [anchors], block, mask_token_id, 1.0, draft.context_window)
            rows = (torch.arange(batch.tokens.shape[1], device=batch.tokens.device) % block).nonzero().squeeze(1)
            _, logits = draft.packed(batch.tokens, batch.hidden, batch.ctx_pos, batch.block_pos, batch.mask, rows,
                                     batch.segments)
            labels = head_labels(draft, batch.labels[rows]).view(len(anchors), block - 1)
            hit = (logits[0].argmax(-1).view(len(anchors), block - 1) == labels) & (labels >= 0)
            runs.append(1 + hit.int().cumprod(dim=1).sum(dim=1).float())
    return torch.cat(runs).mean().item() if runs else 1.0


def draft_loss(draft: Draft) -> DraftLoss:
    """The loss module that trains `draft` (call it on a Batch)."""
    return DFlash2Loss(draft) if isinstance(draft, DFlash2Draft) else DraftLoss(draft)
