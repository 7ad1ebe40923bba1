"""Peak resident memory of exporting a Gemma-4-shaped target, per parameter, for each export setting.

    python -m tools.export_memory OUT_DIR [--shape small|31b] [--layers 16 ...] [--hidden 1536]
                                  [--settings fp32 bf16 8da4w mlx-4w]

Writes a synthetic checkpoint in Gemma 4 31B's layout (bf16 safetensors shards, tied 262144-row
embedding, five sliding layers then one full layer with K = V) and a one-layer draft for it, then exports
the target once per setting, each in a fresh process, and prints the peak resident memory (VmHWM) each
recorded in its memory report (the export stage's `reports/export_target.json`), per parameter, and the
wall time. `--shape small` (about 1B parameters at 16 layers) is narrow; `--shape 31b` has Gemma 4 31B's
own per-layer shapes (hidden 5376, MLP 21504, 32 heads, 16 KV heads of 256 / 4 global ones of 512) with
fewer layers: given several `--layers`, a line per setting fits peak = fixed + per-parameter x
parameters and extrapolates it to the 31B's 60 layers, the RAM a build host needs. Nothing here is a
pipeline stage: it is how docs/measurements.md's memory figures were measured.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig

from dflash_et.checkpoints import builtin, zlab
from dflash_et.checkpoints.families import gemma4

SHARD_BYTES = 1 << 29
SETTINGS = {"fp32": {"dtype": "fp32"}, "bf16": {"dtype": "bf16"}, "8da4w": {"dtype": "fp32", "quantize": "8da4w"},
            "mlx-4w": {"backend": "mlx", "dtype": "bf16", "quantize": "4w"}}
FULL_LAYERS = 60  # Gemma 4 31B's


def shape(name: str, layers: int, hidden: int) -> Gemma4TextConfig:
    """A Gemma 4 text config: `31b` has the 31B's per-layer shapes (executorch's examples/models/gemma4_31b,
    its config.json), `small` the narrow one of `hidden`; both its vocabulary, tied, and K = V full layers."""
    widths = (dict(hidden_size=5376, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
                   num_global_key_value_heads=4) if name == "31b" else
              dict(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=8, num_key_value_heads=4,
                   num_global_key_value_heads=1))
    return Gemma4TextConfig(
        vocab_size=262144, num_hidden_layers=layers, head_dim=256, global_head_dim=512, attention_k_eq_v=True,
        sliding_window=1024, hidden_size_per_layer_input=0, final_logit_softcapping=30.0, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=[1, 6], pad_token_id=0, dtype="bfloat16", **widths)


def shapes_of(config: Gemma4TextConfig) -> dict[str, torch.Size]:
    """The checkpoint's tensors (a tied head has none), from the model built on the meta device (no memory)."""
    with torch.device("meta"):
        return {k: v.shape for k, v in Gemma4ForCausalLM(config).state_dict().items() if k != "lm_head.weight"}


def write_checkpoint(out: Path, config: Gemma4TextConfig) -> int:
    """A random bf16 Gemma 4 text checkpoint, written shard by shard; returns its parameter count. One already
    written (its index there) is reused."""
    shapes = shapes_of(config)
    params = sum(s.numel() for s in shapes.values())
    if (out / "model.safetensors.index.json").exists():
        return params
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    GenerationConfig(bos_token_id=2, eos_token_id=[1, 6], pad_token_id=0).save_pretrained(out)
    builtin.build_tokenizer(**gemma4.FAMILY.builtin.tokenizer).save_pretrained(out)
    gen = torch.Generator().manual_seed(0)
    weight_map, shard, size, n = {}, {}, 0, 0

    def flush() -> None:
        nonlocal shard, size
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard, size = {}, 0

    for key, dims in shapes.items():
        shard[key] = (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16) if len(dims) > 1 else \
            torch.ones(dims, dtype=torch.bfloat16)
        size += shard[key].nbytes
        n += shard[key].numel()
        if size >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return n


def export(target: Path, draft: Path, setting: str, build: Path, report: Path) -> float:
    """Export target.pte in a fresh process (its peak its own); returns the wall time in seconds."""
    config = {"max_seq_len": 256, "prefill_chunk": 16, "max_block_size": 16, **SETTINGS[setting]}
    # spilling whatever the checkpoint's size (frugal.pays leaves a small one to ExecuTorch's serializer): the
    # figures in docs/measurements.md are the frugal export's
    code = ("from pathlib import Path; from dflash_et.export import frugal; frugal.SPILL_FROM_BYTES = 0; "
            "from dflash_et.export.config import ExportConfig; from dflash_et.export.lower import export_program; "
            f"export_program('target', Path({str(target)!r}), Path({str(draft)!r}), "
            f"ExportConfig.from_params({config!r}), Path({str(build)!r}), Path({str(report)!r}))")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least squares peak = fixed + slope x parameters over (parameters, peak) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def write_draft(out: Path, target_dir: Path) -> None:
    if (out / "config.json").exists():
        return
    config = zlab.draft_config(json.loads((target_dir / "config.json").read_text()), 4, 1, 16)
    zlab.save_draft(out, config, zlab.init_draft_weights(config, seed=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=("small", "31b"), default="small")
    parser.add_argument("--layers", type=int, nargs="+", default=[16])
    parser.add_argument("--hidden", type=int, default=1536, help="the small shape's width")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        model = args.out / f"{args.shape}-{layers}"
        target, draft = model / "target", model / "draft"
        params = write_checkpoint(target, shape(args.shape, layers, args.hidden))
        write_draft(draft, target)
        print(f"synthetic Gemma 4 target ({args.shape}, {layers} layers): {params / 1e9:.2f}B parameters", flush=True)
        for name in args.settings:
            report = model / f"memory-{name}.json"
            wall = export(target, draft, name, model / f"build-{name}", report)
            peak = json.loads(report.read_text())["peak_rss_bytes"]
            rows.append({"shape": args.shape, "layers": layers, "setting": name, "parameters": params,
                         "vm_hwm": peak, "wall_s": round(wall, 1)})
            print(f"{args.shape} {layers} layers {params / 1e9:.2f}B {name}: VmHWM {peak / 2**30:.2f} GiB = "
                  f"{peak / params:.2f} bytes/parameter, {wall:.0f} s", flush=True)
    (args.out / f"memory-{args.shape}.json").write_text(json.dumps(rows, indent=1) + "\n")
    full = sum(s.numel() for s in shapes_of(shape(args.shape, FULL_LAYERS, args.hidden)).values())
    for name in args.settings:
        points = [(r["parameters"], r["vm_hwm"]) for r in rows if r["setting"] == name]
        if len({x for x, _ in points}) < 2:
            continue
        fixed, slope = fit(points)
        print(f"{name}: {fixed / 2**30:.2f} GiB + {slope:.2f} bytes/parameter; {FULL_LAYERS} layers "
              f"({full / 1e9:.1f}B): {(fixed + slope * full) / 2**30:.1f} GiB", flush=True)


if __name__ == "__main__":
    main()
