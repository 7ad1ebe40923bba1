"""A bench's runs: its settings (`BenchConfig`), every mode decoded on every prompt (`collect`), and what each
metric reads of them (`Runs`); bench.py turns them into bench.json's metrics and plots."""

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import LONG, document_texts, with_documents
from dflash_et.runtime.adaptive import AUTO
from dflash_et.runtime.cost_curve import CostCurve
from dflash_et.runtime.decoder import Decoder
from dflash_et.runtime.engine import BlockSize
from dflash_et.runtime.generate import Generation, Round
from dflash_et.runtime.sampling import Sampler, Sampling


@dataclass(frozen=True)
class BenchConfig:
    """The `bench` section of params.yaml (what each setting does: its comment there)."""

    prompts: str = "builtin"
    num_prompts: int = 30
    long_prompts: int = 6
    max_new_tokens: int = 64
    repeats: int = 1
    warmup: int = 1
    latency_repeats: int = 10
    block_sizes: tuple[int, ...] = (2, 4, 8, 16)
    temperature: float | str = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    proposals: str = "argmax"
    seed: int = 0
    runner: str = "python"

    def sampling(self) -> Sampling | None:
        """The explicit sampling settings (checked), or None for the programs' recommended ones."""
        if self.temperature == "recommended":
            return None
        if isinstance(self.temperature, str):
            raise ValueError(f"bench.temperature must be a number or 'recommended', got {self.temperature!r}")
        return Sampling(float(self.temperature), self.top_p, self.top_k, self.proposals, self.seed)


def throughput(runs: list[Generation]) -> float:
    tokens = sum(len(g.tokens) - 1 for g in runs)
    seconds = sum(g.decode_s for g in runs)
    return tokens / seconds if seconds > 0 else 0.0


def _blocks(config: BenchConfig, block_size: BlockSize, max_block: int) -> tuple[list[int], list[int]]:
    """(fixed blocks to run, blocks of `block_sizes` the programs do not take)."""
    wanted = set(config.block_sizes) | ({int(block_size)} if block_size != AUTO else set())
    return sorted(b for b in wanted if b <= max_block), sorted(b for b in wanted if b > max_block)


@dataclass
class Runs:
    """One bench's generations, and what its metrics read beside them."""

    config: BenchConfig
    block_size: BlockSize        # as asked for (bench.json's block_size)
    headline: str                # the mode of the headline tau and speedup: block_size's
    settings: Sampling
    modes: dict[str, BlockSize]  # the DFlash modes by name: each fixed block, then auto
    too_large: list[int]         # blocks of bench.block_sizes the programs do not take
    max_block: int
    curve: CostCurve             # this device's, timed before decoding: auto's input
    prompts: int
    lossless: bool               # every DFlash output equals plain decoding's (meaningful when greedy)
    generations: dict[str, list[dict[str, list[Generation]]]]  # [mode][repeat][category]; mode "ar": plain
    prompt_lengths: dict[str, list[int]]  # [category]: its prompts' tokens, in the order of its generations

    @property
    def categories(self) -> list[str]:
        return list(self.generations["ar"][0])

    @property
    def fixed(self) -> list[str]:
        return [mode for mode in self.modes if mode != AUTO]

    def pooled(self, mode: str, category: str | None = None, repeat: int | None = None) -> list[Generation]:
        """A mode's generations: of every repeat (or one), of every category (or one)."""
        repeats = self.generations[mode] if repeat is None else [self.generations[mode][repeat]]
        return [g for per_repeat in repeats for c, gs in per_repeat.items() if category in (None, c) for g in gs]

    def rounds(self, mode: str, category: str | None = None) -> list[Round]:
        return [r for g in self.pooled(mode, category) for r in g.rounds]

    def speedup(self, mode: str, category: str | None = None, repeat: int | None = None) -> float:
        ar = throughput(self.pooled("ar", category, repeat))
        return throughput(self.pooled(mode, category, repeat)) / ar if ar else 0.0

    def spread(self, mode: str, category: str | None = None) -> list[float]:
        """The lowest and highest speedup of one repeat: the run's own noise, to judge differences by."""
        per_repeat = [self.speedup(mode, category, repeat) for repeat in range(self.config.repeats)]
        return [min(per_repeat), max(per_repeat)]


def _sampler(settings: Sampling, run: int) -> Sampler:
    return Sampler(replace(settings, seed=settings.seed + run))


def _decode(decoder: Decoder, rows: list[dict], encoded: list[list[int]], modes: dict[str, BlockSize],
            config: BenchConfig, settings: Sampling) -> tuple[dict, bool]:
    """(generations[mode][repeat][category], lossless): plain decoding and every mode, interleaved prompt by
    prompt, after a warm-up that is not kept."""
    for ids in encoded[:config.warmup]:
        decoder.ar(ids, config.max_new_tokens, sampler=_sampler(settings, -1))
        for block in modes.values():
            decoder.dflash(ids, config.max_new_tokens, block, sampler=_sampler(settings, -1))
    runs = {mode: [defaultdict(list) for _ in range(config.repeats)] for mode in ["ar", *modes]}
    lossless = True
    for repeat in tqdm(range(config.repeats), desc="bench repeats", disable=config.repeats == 1):
        for i, (row, ids) in enumerate(tqdm(list(zip(rows, encoded)), desc=f"bench ({len(runs)} modes)")):
            run = repeat * len(rows) + i
            ar = decoder.ar(ids, config.max_new_tokens, sampler=_sampler(settings, run))
            runs["ar"][repeat][row["category"]].append(ar)
            for mode, block in modes.items():
                out = decoder.dflash(ids, config.max_new_tokens, block, sampler=_sampler(settings, run))
                lossless &= out.tokens == ar.tokens or not settings.greedy
                runs[mode][repeat][row["category"]].append(out)
    return runs, lossless


def long_rows(rows: list[dict], config: BenchConfig, max_context_len: int, count) -> list[dict]:
    """`config.long_prompts` rows of the `long` category: the first questions of `rows`, each after a document of
    the set's train-split texts, lengths spread evenly from half to all of the cache left for the reply."""
    n = config.long_prompts
    if not n:
        return []
    room = max_context_len - config.max_new_tokens
    lengths = [room // 2 + (room - room // 2) * i // max(n - 1, 1) for i in range(n)]
    questions = [rows[i % len(rows)]["prompt"] for i in range(n)]
    return [{"category": LONG, "prompt": p}
            for p in with_documents(questions, document_texts(config.prompts, room), lengths, count)]


def collect(decoder: Decoder, programs_dir: Path, rows: list[dict], block_size: BlockSize,
            config: BenchConfig, settings: Sampling | None) -> Runs:
    """Everything the metrics and plots read: the cost curve, then every mode's generations of `rows`."""
    headline = str(decoder.check_block_size(block_size))
    settings = settings or decoder.recommended(proposals=config.proposals, seed=config.seed)
    fixed, too_large = _blocks(config, block_size, decoder.max_block_size)
    modes = {str(b): b for b in fixed} | {AUTO: AUTO}
    curve = decoder.cost_curve(config.latency_repeats)  # auto's input, timed by the runner that decodes
    tok = tokenizer(programs_dir)
    rows = rows + long_rows(rows, config, decoder.max_context_len, lambda p: len(encode_chat(tok, p)))
    encoded = [encode_chat(tok, r["prompt"]) for r in rows]
    generations, lossless = _decode(decoder, rows, encoded, modes, config, settings)
    lengths = defaultdict(list)
    for row, ids in zip(rows, encoded):
        lengths[row["category"]].append(len(ids))
    return Runs(config, block_size, headline, settings, modes, too_large, decoder.max_block_size, curve, len(rows),
                lossless, generations, dict(lengths))
