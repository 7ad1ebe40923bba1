"""This project's programs beside llama.cpp on the same machine, weights and prompts: plain and DFlash decoding
of each, greedy, interleaved prompt by prompt in one process tree, so that drift in machine speed hits all four.

llama.cpp gets the same checkpoints converted by its own tools at the matching precision (F32 for fp32
programs, Q8_0 for 8da8w, Q4_0 for 8da4w) and the bench's prompts as token ids, and its DFlash runs at each
`draft_max` (proposals a round; it also stops a round's drafting early by the draft's confidence, its own
adaptive length). Throughput is decode tokens per second after the first token (which prefill produces),
as llama-server times it and as the bench does. What llama.cpp refuses is reported with its reason.
"""

import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from dflash_et.checkpoints.load import has_draft
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import load_prompts
from dflash_et.params import parse
from dflash_et.peer.llama_cpp import VERSION, LlamaCpp, Refused, Server, gguf_pair, matched_type
from dflash_et.evaluate.bench import BenchConfig
from dflash_et.runtime.engine import BlockSize, Engine
from dflash_et.runtime.programs import export_summary, missing_backend

PLOT_COLUMNS = ("run", "engine", "category", "tokens_per_s")  # run: "<category>: <engine>", one bar each


@dataclass(frozen=True)
class PeerConfig:
    """The `peers` section of params.yaml (what each setting does: its comment there)."""

    draft_max: tuple[int, ...] = (3, 15)
    threads: int | None = None
    context: int = 1024

    @classmethod
    def from_params(cls, params: dict) -> "PeerConfig":
        config = parse(cls, params, "peers")
        if not config.draft_max or min(config.draft_max) < 1:
            raise ValueError(f"peers.draft_max must list proposals per round >= 1, got {list(config.draft_max)}")
        return config

    @property
    def cores(self) -> int:
        return self.threads or len(os.sched_getaffinity(0))


@dataclass
class Run:
    """One engine's decoding of one prompt."""

    tokens: list[int]
    seconds: float  # decoding after the first token
    rounds: int     # target calls after the first token

    @property
    def decoded(self) -> int:
        return len(self.tokens) - 1


def _from_llama(reply: dict) -> Run:
    t = reply["timings"]
    steps = max(t["predicted_n"] - 1, 0)
    return Run(reply["tokens"], t["predicted_ms"] / 1000, steps - t.get("draft_n_accepted", 0))


def _summary(runs: dict[str, list[Run]], plain: dict[str, list[Run]] | None = None) -> dict:
    """tokens/s (and, beside plain decoding, tau and speedup), pooled and per category."""
    def of(category: str | None) -> list[Run]:
        return [r for c, rs in runs.items() if category in (None, c) for r in rs]

    def tps(rs: list[Run]) -> float:
        seconds = sum(r.seconds for r in rs)
        return sum(r.decoded for r in rs) / seconds if seconds else 0.0

    def row(category: str | None) -> dict:
        out = {"tokens_per_s": tps(of(category))}
        if plain is not None:
            rs = of(category)
            base = tps([r for c, p in plain.items() if category in (None, c) for r in p])
            out |= {"tau": sum(r.decoded for r in rs) / max(sum(r.rounds for r in rs), 1),
                    "speedup": out["tokens_per_s"] / base if base else 0.0}
        return out

    return row(None) | {"by_category": {c: row(c) for c in runs}}


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """How far two engines' greedy outputs agree: prompts with identical tokens, and the mean share of each
    output before the first difference (rounding differs between engines, so near-ties may flip)."""
    def prefix(a: list[int], b: list[int]) -> float:
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n / max(len(a), len(b), 1)

    return {"identical": statistics.fmean(a == b for a, b in zip(ours, theirs)),
            "common_prefix": statistics.fmean(prefix(a, b) for a, b in zip(ours, theirs))}


def _llama_cpp(target_dir: Path, draft_dir: Path, gguf_dir: Path,
               export: dict) -> tuple[LlamaCpp | None, dict, str | None]:
    """(llama.cpp built, the GGUF pair converted into `gguf_dir`, None), or (None, {}, what llama.cpp refused)."""
    try:
        ggufs = gguf_pair(target_dir, draft_dir if has_draft(draft_dir) else None, gguf_dir, export["quantize"],
                          export["dtype"])
        return LlamaCpp.source().build(), ggufs, None
    except Refused as e:
        return None, {}, str(e)


def _start_servers(servers: dict[str, Server], llama: LlamaCpp, ggufs: dict, config: PeerConfig) -> str | None:
    """Starts llama.cpp's plain server and a DFlash one per `draft_max` (none without a draft) into `servers`: all
    of them, or (closing those started) none and what llama.cpp refused."""
    try:
        servers["llama_cpp_plain"] = Server(llama, ggufs["target"], config.cores, config.context)
        for n in config.draft_max if "draft" in ggufs else ():
            servers[f"llama_cpp_dflash_{n}"] = Server(llama, ggufs["target"], config.cores, config.context,
                                                      draft=ggufs["draft"], draft_max=n)
    except Refused as e:
        for server in servers.values():
            server.close()
        servers.clear()
        return str(e)
    return None


def _decoder(engine: Engine, block: BlockSize, servers: dict[str, Server], max_new_tokens: int):
    """decode(engine name, prompt ids) -> Run, for this project's two engines and each llama.cpp server."""
    def decode(name: str, ids: list[int]) -> Run:
        if name == "executorch_plain":
            g = engine.ar(ids, max_new_tokens)
        elif name == "executorch_dflash":
            g = engine.dflash(ids, max_new_tokens, block)
        else:
            return _from_llama(servers[name].complete(ids, max_new_tokens))
        return Run(g.tokens, g.decode_s, len(g.rounds))

    return decode


def _measure(decode, engines: list[str], rows: list[dict], prompts: list[list[int]],
             warmup: int) -> dict[str, dict[str, list[Run]]]:
    """runs[engine][category]: every engine on each prompt in turn, after a warm-up that is not kept."""
    for ids in prompts[:warmup]:
        for name in engines:
            decode(name, ids)
    runs = {name: defaultdict(list) for name in engines}
    for row, ids in tqdm(list(zip(rows, prompts)), desc=f"peers ({len(engines)} engines)"):
        for name in engines:
            runs[name][row["category"]].append(decode(name, ids))
    return runs


def _target_call_ms(engine: Engine, llama: LlamaCpp, target_gguf: Path, config: PeerConfig) -> dict:
    """One target call of 1 token and of the largest block, on both sides, at the start of the cache."""
    # both sides timed now, one after the other: a curve from another hour would compare machine states
    curve = engine.measure_cost_curve(repeats=3)
    position = curve.positions[0]
    try:
        theirs = llama.call_ms(target_gguf, config.cores, engine.max_block_size, position)
    except Refused as e:
        theirs = {"refused": str(e)}
    ours = {str(t): curve.target(t, position) for t in (1, engine.max_block_size)}
    return {"position": position, "executorch": ours, "llama_cpp": theirs}


def _engines(runs: dict[str, dict[str, list[Run]]]) -> dict:
    """Each engine's summary: DFlash ones beside the plain decoding of the same engine."""
    plain_of = {"executorch": runs["executorch_plain"], "llama_cpp": runs.get("llama_cpp_plain")}
    return {name: _summary(rs, None if name.endswith("plain") else plain_of[name.split("_dflash")[0]])
            for name, rs in runs.items()}


def run_peers(programs_dir: Path, target_dir: Path, draft_dir: Path, block_size: BlockSize, bench: BenchConfig,
              config: PeerConfig, gguf_dir: Path, cost_curve: Path | None = None) -> tuple[dict, list[dict]]:
    """(peers.json metrics, plot rows). The programs' export.json says their precision; llama.cpp gets its
    match, converted into `gguf_dir`."""
    skipped = missing_backend(programs_dir)
    if skipped:
        return {"skipped": skipped}, []
    export = export_summary(programs_dir)["config"]
    gguf_type = matched_type(export["quantize"], export["dtype"])
    rows = load_prompts(bench.prompts, bench.num_prompts)
    tok = tokenizer(programs_dir)
    prompts = [encode_chat(tok, r["prompt"]) for r in rows]
    engine = Engine(programs_dir, cost_curve)
    block = engine.check_block_size(block_size)
    metrics: dict = {"llama_cpp_version": VERSION, "prompts": len(rows), "max_new_tokens": bench.max_new_tokens,
                     "threads": config.cores, "executorch": {"precision": export["quantize"] if export["quantize"]
                     != "none" else export["dtype"], "block_size": block}}
    llama, ggufs, refused = _llama_cpp(target_dir, draft_dir, gguf_dir, export)
    metrics["llama_cpp"] = {"precision": gguf_type, **({"refused": refused} if refused else {})}
    servers: dict[str, Server] = {}  # all up at once, so that prompt by prompt the engines take turns
    try:
        if llama is not None and (refused := _start_servers(servers, llama, ggufs, config)):
            metrics["llama_cpp"]["refused"] = refused
        engines = ["executorch_plain", "executorch_dflash", *servers]
        runs = _measure(_decoder(engine, block, servers, bench.max_new_tokens), engines, rows, prompts, bench.warmup)
    finally:
        for server in servers.values():
            server.close()
    metrics["engines"] = engines_out = _engines(runs)
    tokens = {name: [r.tokens for c in rs.values() for r in c] for name, rs in runs.items()}
    metrics["token_agreement_with_executorch_plain"] = {name: agreement(tokens["executorch_plain"], tokens[name])
                                                        for name in engines if name != "executorch_plain"}
    if servers:
        dflash = [n for n in engines if n.startswith("llama_cpp_dflash")]
        if dflash:
            metrics["llama_cpp"]["best_dflash"] = max(dflash, key=lambda n: engines_out[n]["tokens_per_s"])
        metrics["target_call_ms"] = _target_call_ms(engine, llama, ggufs["target"], config)
    plot = [{"run": f"{c}: {name}", "engine": name, "category": c,
             "tokens_per_s": engines_out[name]["by_category"][c]["tokens_per_s"]}
            for name in engines for c in engines_out[name]["by_category"]]
    return metrics, plot
