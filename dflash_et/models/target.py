"""The target LM, which also returns the hidden states DFlash's draft reads.

`forward(tokens [1,T], input_pos [T]) -> (logits [1,T,V], taps [1,T,k*H])`. A call writes K/V at
`input_pos` and attends causally to everything before; rolling back is just calling again at an
earlier position, since attention never looks past the current call.
"""

import torch
from torch import nn

from dflash_et.models.block import Block, ModelArgs, start_position
from dflash_et.models.layers import RMSNorm


class Target(nn.Module):
    """A Qwen3/Llama-style causal LM; `cache` names the attention backend (see models.attention)."""

    def __init__(self, a: ModelArgs, rope: tuple[torch.Tensor, torch.Tensor], layer_ids: list[int],
                 cache: str = "dense"):
        super().__init__()
        self.args, self.layer_ids, self.max_seq_len = a, list(layer_ids), rope[0].shape[0]
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(Block(a, spec, self.max_seq_len, cache) for spec in a.layers)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        if a.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("rope_cos", rope[0], persistent=False)
        self.register_buffer("rope_sin", rope[1], persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = start_position(input_pos, tokens.shape[1], self.max_seq_len)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        x = self.embed_tokens(tokens)
        taps = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, start, input_pos)
            taps[i] = x
        x = self.norm(x)
        # transformers' hidden_states[L] (the last layer's output) is taken after the final norm.
        taps[len(self.layers) - 1] = x
        return self.lm_head(x), torch.cat([taps[i] for i in self.layer_ids], dim=-1)
