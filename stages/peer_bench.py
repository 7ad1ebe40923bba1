"""peer_bench stage (opt-in, `-S peer_bench=true`): `python -m stages.peer_bench PROGRAMS TARGET_DIR DRAFT_DIR
COST_CURVE GGUF_DIR REPORT PLOT` measures llama.cpp beside the programs (dflash_et.evaluate.peers) and writes
peers.json (a DVC metric), its plot's rows and the GGUFs it converted. Off, it writes a `skipped` report and
empty outputs, so the default pipeline builds nothing."""

import json
from pathlib import Path

from dflash_et.evaluate.bench import BenchConfig
from dflash_et.evaluate.peers import PLOT_COLUMNS, PeerConfig, run_peers
from dflash_et.files import staged_dir, write_csv, write_json
from dflash_et.params import params, parse
from stages.common import run


def main(argv: list[str]) -> None:
    programs, target_dir, draft_dir, curve, gguf_dir, report, plot = map(Path, argv)
    p = params()
    bench, peers = parse(BenchConfig, p.get("bench"), "bench"), PeerConfig.from_params(p.get("peers") or {})
    with staged_dir(gguf_dir) as gguf:
        if p.get("peer_bench"):
            metrics, rows = run_peers(programs, target_dir, draft_dir, p["block_size"], bench, peers, gguf,
                                      curve if json.loads(curve.read_text() or "{}") else None)
        else:
            metrics, rows = {"skipped": "peer_bench is false; -S peer_bench=true measures llama.cpp beside these "
                                        "programs (it builds llama.cpp once, tens of minutes)"}, []
    write_csv(plot, rows, PLOT_COLUMNS)
    write_json(report, metrics)
    if metrics.get("skipped"):
        print(f"[peer_bench] skipped: {metrics['skipped']}")
        return
    for name, e in metrics["engines"].items():
        extra = f", tau {e['tau']:.2f}, {e['speedup']:.2f}x its plain decoding" if "tau" in e else ""
        print(f"[peer_bench] {name}: {e['tokens_per_s']:.1f} tokens/s{extra}")
    if "refused" in metrics["llama_cpp"]:
        print(f"[peer_bench] llama.cpp not measured: {metrics['llama_cpp']['refused']}")


if __name__ == "__main__":
    run(main)
