"""The target LM, which also returns the hidden states DFlash's draft reads.

`forward(tokens [1,T], input_pos [T]) -> (logits [1,T,V], taps [1,T,k*H])`; `LogitsOnly` is the same model
returning logits alone (the stock runners' method of target.pte: export.lower). A call writes K/V at
`input_pos` and attends causally to everything before; rolling back is just calling again at an
earlier position, since attention never looks past the current call. Hybrid targets' DeltaNet
layers keep that contract by replaying (models.deltanet), as long as calls go forward: each starts
at 0 or within the previous call.
"""

import copy

import torch
from torch import nn

from dflash_et.models.block import ModelArgs, Rope, block, scale_embedding, softcap, start_position
from dflash_et.models.layers import RMSNorm


class Target(nn.Module):
    """A Qwen3/Llama/Gemma 4/Qwen3.5-style causal LM; `ops` names the op set (see
    models.attention); `max_call`, `verify_call` and `ring` size the caches (see models.block)."""

    def __init__(self, a: ModelArgs, rope: dict[str, tuple[torch.Tensor, torch.Tensor]], layer_ids: list[int],
                 ops: str = "torch", max_call: int | None = None, verify_call: int | None = None,
                 ring: bool = False):
        super().__init__()
        self.rope = Rope(rope)
        self.args, self.layer_ids, self.max_seq_len = a, list(layer_ids), self.rope.max_seq_len
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(block(a, spec, self.max_seq_len, ops, max_call, verify_call, ring)
                                    for spec in a.layers)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps, offset=a.norm_offset)
        self.lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Tied checkpoints store the embedding only; loading assigns it, so the head is pointed at it again."""
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = start_position(input_pos, tokens.shape[1], self.max_seq_len)
        rope = self.rope(input_pos)
        x = scale_embedding(self.embed_tokens(tokens), self.args.embed_scale)
        taps = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, start, input_pos)
            taps[i] = x
        x = self.norm(x)
        # transformers' hidden_states[L] (the last layer's output) is taken after the final norm.
        taps[len(self.layers) - 1] = x
        logits = softcap(self.lm_head(x), self.args.logit_softcap)
        return logits, torch.cat([taps[i] for i in self.layer_ids], dim=-1)


class LogitsOnly(Target):
    """A target as ExecuTorch's stock runners call it: logits alone (`TextLLMRunner` takes the first output to be
    logits and refuses more). `of` makes one that views a Target: the same weights and KV caches under the same
    names, so the two methods exported from them share their caches (export.lower)."""

    @classmethod
    def of(cls, target: Target) -> "LogitsOnly":
        view = copy.copy(target)  # a shallow copy: its modules, parameters and buffers are the target's own
        view.__class__ = cls
        return view

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens, input_pos)[0]
