"""Peak resident memory of exporting a Gemma-4-shaped target, per parameter, for each export dtype.

    python -m tools.export_memory OUT_DIR [--layers 16] [--hidden 1536] [--settings fp32 bf16 8da4w]

Writes a synthetic checkpoint in Gemma 4 31B's layout (bf16 safetensors shards, tied 262144-row
embedding, five sliding layers then one full layer with K = V; about 1B parameters by default) and a
one-layer draft for it, then exports the target once per setting, each in a fresh process, and prints
the peak RSS each recorded in its memory report (the export stage's `reports/export_target.json`). Nothing here is a pipeline stage: it is how docs/measurements.md's
memory figures were measured.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig

from dflash_et.checkpoints import builtin, zlab
from dflash_et.checkpoints.families import gemma4

SHARD_BYTES = 1 << 29
SETTINGS = {"fp32": {"dtype": "fp32"}, "bf16": {"dtype": "bf16"}, "8da4w": {"dtype": "fp32", "quantize": "8da4w"}}


def write_checkpoint(out: Path, layers: int, hidden: int) -> int:
    """A random bf16 Gemma 4 text checkpoint, written shard by shard; returns its parameter count."""
    config = Gemma4TextConfig(
        vocab_size=262144, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, global_head_dim=512, num_global_key_value_heads=1,
        attention_k_eq_v=True, sliding_window=1024, hidden_size_per_layer_input=0, final_logit_softcapping=30.0,
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=[1, 6], pad_token_id=0, dtype="bfloat16")
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Gemma4ForCausalLM(config).state_dict().items() if k != "lm_head.weight"}
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

    for key, shape in shapes.items():
        shard[key] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16) if len(shape) > 1 else \
            torch.ones(shape, dtype=torch.bfloat16)
        size += shard[key].nbytes
        n += shard[key].numel()
        if size >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return n


def write_draft(out: Path, target_dir: Path) -> None:
    config = zlab.draft_config(json.loads((target_dir / "config.json").read_text()), 4, 1, 16)
    zlab.save_draft(out, config, zlab.init_draft_weights(config, seed=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args()
    target, draft = args.out / "target", args.out / "draft"
    params = write_checkpoint(target, args.layers, args.hidden)
    write_draft(draft, target)
    print(f"synthetic Gemma 4 target: {params / 1e9:.2f}B parameters", flush=True)
    for name in args.settings:
        build = args.out / f"build-{name}"
        export = {"max_seq_len": 256, "prefill_chunk": 16, "max_block_size": 16, **SETTINGS[name]}
        report = args.out / f"memory-{name}.json"
        code = ("from pathlib import Path; from dflash_et.export.lower import ExportConfig, export_program; "
                f"export_program('target', Path({str(target)!r}), Path({str(draft)!r}), "
                f"ExportConfig.from_params({export!r}), Path({str(build)!r}), Path({str(report)!r}))")
        subprocess.run([sys.executable, "-c", code], check=True)
        peak = json.loads(report.read_text())["peak_rss_bytes"]
        print(f"{name}: peak RSS {peak / 2**30:.2f} GiB = {peak / params:.2f} bytes/parameter", flush=True)


if __name__ == "__main__":
    main()
