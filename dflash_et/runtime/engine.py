"""The DFlash engine over the ExecuTorch programs: what `dflash generate` and the bench run.

Every limit comes from the programs' metadata (max_seq_len, prefill chunk, EOS ids, mask token,
max block), so the engine needs nothing but the programs directory.
"""

from pathlib import Path

from dflash_et.runtime.generate import Generation, OnTokens, generate_ar, generate_dflash
from dflash_et.runtime.programs import load_programs


class Engine:
    def __init__(self, programs_dir: Path):
        self.target, self.draft = load_programs(programs_dir)
        t, d = self.target.meta, self.draft.meta
        self.max_seq_len, self.chunk, self.eos_ids = t["max_seq_len"], t["max_chunk"], set(t["eos_ids"])
        self.mask_token_id, self.max_block_size = d["mask_token_id"], d["max_block_size"]

    def check_block_size(self, block_size: int) -> int:
        if not 2 <= block_size <= self.max_block_size:
            raise ValueError(f"block_size {block_size} is outside 2..{self.max_block_size}, the largest block "
                             f"{self.draft.path.name} was exported for; re-export with export.max_block_size={block_size}")
        return block_size

    def ar(self, prompt: list[int], max_new_tokens: int, on_tokens: OnTokens = None) -> Generation:
        """Plain greedy decoding with target.pte alone: the baseline."""
        return generate_ar(self.target, prompt, max_new_tokens, self.eos_ids, self.max_seq_len, self.chunk, on_tokens)

    def dflash(self, prompt: list[int], max_new_tokens: int, block_size: int | None = None,
               on_tokens: OnTokens = None) -> Generation:
        """Greedy DFlash decoding with target.pte verifying draft.pte's blocks."""
        block_size = self.check_block_size(block_size or self.max_block_size)
        return generate_dflash(self.target, self.draft, prompt, max_new_tokens, self.eos_ids, self.max_seq_len,
                               self.chunk, block_size, self.mask_token_id, on_tokens)
