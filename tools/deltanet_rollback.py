"""What rolling a Gated DeltaNet layer back costs at a real model's shapes (default: Qwen3.5-4B; or a
checkpoint's, `--target DIR`), per layer and over all its DeltaNet layers, for the two known ways:

- replay (what models.deltanet does): keep the state at the call's start and the call's replay inputs;
  the next call reruns the recurrence over the stored rows (those past the kept prefix masked out);
- per-position states: keep the state after every token of a verify call and select one.

Times are one layer's, eager, with ExecuTorch's fused `llama::gated_delta_rule` (the programs' kernel),
fp32, median of `--repeats`. Run: `python -m tools.deltanet_rollback [--target DIR] [--threads N]`.
"""

import argparse
import json
from pathlib import Path

import dflash_et  # noqa: F401  (first: quiets the loaders)
import torch

from dflash_et.checkpoints.load import load_config, model_args
from dflash_et.models.deltanet import DeltaNetSpec, GatedDeltaNet, fused_rule
from tools.timing import median_ms

QWEN3_5_4B = dict(hidden=2560, layers=24, spec=DeltaNetSpec(16, 32, 128, 128, 4))  # 24 of its 32 layers


def measure(hidden: int, spec: DeltaNetSpec, verify: int, max_call: int, repeats: int) -> dict:
    layer = GatedDeltaNet(hidden, spec, 1e-6, max_call, verify, ops="llama").eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
    x = torch.randn(1, verify, hidden)
    h, dk, dv = spec.num_v_heads, spec.k_head_dim, spec.v_head_dim
    q, k = torch.nn.functional.normalize(torch.randn(2, 1, h, verify, dk), dim=-1)
    v, decay, beta = torch.randn(1, h, verify, dv), torch.rand(1, h, verify), torch.rand(1, h, verify)
    state = torch.zeros(1, h, dk, dv)
    states = torch.empty(verify, 1, h, dk, dv)

    def per_position():  # the verify's recurrence token by token, keeping every state
        s = state
        for i in range(verify):
            _, s = fused_rule(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], decay[:, :, i:i + 1],
                              beta[:, :, i:i + 1], s)
            states[i].copy_(s)

    with torch.no_grad():
        layer(x, torch.arange(verify))  # fills the replay rows
        start = torch.tensor([verify // 2])
        call = median_ms(lambda: layer(x, torch.arange(verify) + verify // 2), repeats)
        replay = median_ms(lambda: layer._resume(start), repeats)
        recurrence = median_ms(lambda: fused_rule(q, k, v, decay, beta, state), repeats)
        positions = median_ms(per_position, repeats)
    replay_bytes = 4 * (verify * h * (dk + dv + 2) + (spec.conv_kernel - 1 + max_call) * spec.conv_dim)
    return {"verify_tokens": verify, "max_call": max_call, "layer_call_ms": call, "replay_ms": replay,
            "recurrence_ms": recurrence, "per_position_recurrence_ms": positions,
            "state_bytes": 4 * h * dk * dv, "replay_bytes": replay_bytes + 4 * h * dk * dv,  # + the final state
            "per_position_bytes": verify * 4 * h * dk * dv}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, help="a checkpoint whose shapes to measure (default: Qwen3.5-4B's)")
    parser.add_argument("--verify", type=int, default=16, help="tokens of a verify call (the block)")
    parser.add_argument("--max-call", type=int, default=64, help="the longest call (a prefill chunk)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = QWEN3_5_4B
    if args.target:
        a = model_args(load_config(args.target))
        specs = [s for s in a.layers if isinstance(s, DeltaNetSpec)]
        if not specs:
            raise SystemExit(f"{args.target} has no Gated DeltaNet layers; give a hybrid (Qwen3.5) checkpoint")
        shape = dict(hidden=a.hidden_size, layers=len(specs), spec=specs[0])
    m = measure(shape["hidden"], shape["spec"], args.verify, args.max_call, args.repeats)
    m["all_layers"] = {k: round(v * shape["layers"], 2) for k, v in m.items() if k.endswith(("_ms", "_bytes"))}
    print(json.dumps(m))


if __name__ == "__main__":
    main()
