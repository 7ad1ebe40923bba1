"""The DFlash engine over the ExecuTorch programs: what `dflash generate` and the bench run.

Every limit comes from the programs' metadata (max_seq_len, prefill chunk, EOS ids, mask token,
max block), so the engine needs nothing but the programs directory.
"""

from pathlib import Path

from dflash_et.errors import ProgramError
from dflash_et.runtime.generate import Generation, OnTokens, generate_ar, generate_dflash
from dflash_et.runtime.programs import load_programs
from dflash_et.runtime.sampling import Sampler, Sampling


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

    def recommended(self, **overrides) -> Sampling:
        """The checkpoint's recommended sampling settings (target.pte's metadata), `overrides` on top."""
        if "temperature" not in self.target.meta:
            raise ProgramError(f"{self.target.path} carries no recommended sampling settings (exported before "
                               "they were recorded); re-export it (dvc repro) or give the settings explicitly")
        return Sampling.from_metadata(self.target.meta, **overrides)

    def ar(self, prompt: list[int], max_new_tokens: int, on_tokens: OnTokens = None,
           sampler: Sampler | None = None) -> Generation:
        """Plain decoding with target.pte alone (greedy unless a sampler says otherwise): the baseline."""
        return generate_ar(self.target, prompt, max_new_tokens, self.eos_ids, self.max_seq_len, self.chunk,
                           on_tokens, sampler)

    def dflash(self, prompt: list[int], max_new_tokens: int, block_size: int | None = None,
               on_tokens: OnTokens = None, sampler: Sampler | None = None) -> Generation:
        """DFlash decoding with target.pte verifying draft.pte's blocks (greedy unless a sampler says otherwise)."""
        block_size = self.check_block_size(block_size or self.max_block_size)
        return generate_dflash(self.target, self.draft, prompt, max_new_tokens, self.eos_ids, self.max_seq_len,
                               self.chunk, block_size, self.mask_token_id, on_tokens, sampler)
