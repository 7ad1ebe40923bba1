"""Per-call latency of target.pte (T = 1, 4, 8, 16) and draft.pte (block 16), fp32 and 8da4w, for the
built-in pair and a random model of realistic shape (hidden 1024, 8 layers, 32k vocab).

A benchmark, not a unit test: `pytest -m bench -s` (about 10 minutes on 2 cores). It prints a
table and writes `latency.json` to pytest's temp directory. The runtime threadpool size comes from
DFLASH_THREADS (set before any program loads; changing it later corrupts the heap).
"""

import json
import os
import shutil
import statistics
import time

import pytest
import torch

from dflash_et.checkpoints import builtin
from dflash_et.export.config import ExportConfig
from dflash_et.export.lower import export_program
from dflash_et.runtime.programs import DraftProgram, TargetProgram


def realistic_pair(root, pair):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096)
    Qwen3ForCausalLM(config).save_pretrained(root / "target")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(pair[0] / f, root / "target" / f)
    builtin.write_draft(root / "draft", root / "target")
    return root / "target", root / "draft"


def median_ms(fn, n=7):
    times = []
    for _ in range(n + 1):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times[1:]), 2)


@pytest.mark.bench
def test_program_latency(pair, tmp_path_factory):
    from executorch.extension.pybindings.portable_lib import _threadpool_get_thread_count, _unsafe_reset_threadpool

    if "DFLASH_THREADS" in os.environ:
        _unsafe_reset_threadpool(int(os.environ["DFLASH_THREADS"]))
    root = tmp_path_factory.mktemp("latency")
    pairs = {"builtin": pair, "hidden1024-8L-32k": realistic_pair(root / "big", pair)}
    rows = {}
    for name, (target_dir, draft_dir) in pairs.items():
        width = len(json.loads((draft_dir / "config.json").read_text())["dflash_config"]["target_layer_ids"]) * \
            json.loads((target_dir / "config.json").read_text())["hidden_size"]
        for quantize in ("none", "8da4w"):
            out = root / f"{name}-{quantize}"
            for kind in ("target", "draft"):
                export_program(kind, target_dir, draft_dir, ExportConfig(max_seq_len=1024, quantize=quantize), out / kind)
            target = TargetProgram(out / "target" / "target.pte")
            draft = DraftProgram(out / "draft" / "draft.pte")
            target(torch.zeros(1, 64, dtype=torch.long), torch.arange(64))
            row = {f"target_T{t}_ms": median_ms(lambda: target(torch.zeros(1, t, dtype=torch.long), torch.arange(256, 256 + t)))
                   for t in (1, 4, 8, 16)}
            row["draft_B16_ms"] = median_ms(lambda: draft(torch.zeros(1, 16, dtype=torch.long), torch.zeros(1, 4, width),
                                                           torch.arange(252, 256)))
            rows[f"{name} {quantize}"] = row
            print(f"{name} {quantize} threads={_threadpool_get_thread_count()}: {row}", flush=True)
            assert all(v > 0 for v in row.values())
    (root / "latency.json").write_text(json.dumps(rows, indent=1))
