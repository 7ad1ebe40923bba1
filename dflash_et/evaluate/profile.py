"""Where a program call's time goes, beside what this machine's memory and FMA units allow (`dflash profile`).

ExecuTorch's own profiler records every call: the programs are loaded with ETDump on, each call shape runs
`repeats` times after a warm-up at cache position `pos`, and the devtools Inspector reads the dump. The table
splits each call's median into the backend's matrix products (XNNPACK's Fully Connected and Batch Matrix
Multiply), its other operators, the delegate's own overhead (everything inside a delegate call that no
operator claims), attention (`llama::custom_sdpa`), cache writes (`llama::update_cache`), the other portable
operators and the runtime's own time (between operators, and each portable operator's call around its
kernel); the columns add up to the call's total. Then the most expensive operators by name.

The roofline: a call of T tokens reads every Linear weight once (export.json's `linears.bytes`) and does
2 * T * `linears.parameters` multiply-adds' worth of FLOPs; at this machine's measured read bandwidth and fp32
matmul throughput (torch, every core, measured here first), it cannot take less than the larger of the two
times. Attention and the embedding lookup are left out of both (a few percent at these lengths); weights that
fit in the last-level cache stream faster than memory's bandwidth, so such a call can beat its roofline. An XNNPACK
built without its runtime profiler reports delegate calls only: the backend columns then stay empty.
"""

import json
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from dflash_et.errors import UserError
from dflash_et.metadata import DRAFT_METHOD, TARGET_METHOD

WRAPPERS = ("Method::execute", "DELEGATE_CALL", "OPERATOR_CALL")
MATMULS = ("Fully Connected", "Batch Matrix Multiply")
COLUMNS = ("matmul", "backend ops", "delegate overhead", "attention", "cache writes", "portable ops", "runtime")


@dataclass
class CallProfile:
    """One call shape's median milliseconds: in total, per column of the table, and per operator name."""

    label: str
    tokens: int
    total_ms: float
    columns: dict[str, float]
    ops: dict[str, float] = field(default_factory=dict)


def _column(name: str, delegated: bool) -> str:
    if delegated:
        return "matmul" if name.startswith(MATMULS) else "backend ops"
    if name.startswith("llama::custom_sdpa"):
        return "attention"
    return "cache writes" if name.startswith("llama::update_cache") else "portable ops"


def profile_call(pte: Path, ptd: Path | None, method_name: str, args: list[torch.Tensor], repeats: int, label: str,
                 tokens: int) -> CallProfile:
    """Run `method_name` of `pte` on `args` 1 + `repeats` times under ETDump and summarise the repeats (the
    warm-up is dropped)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (the programs' llama:: kernels)
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte, data_path=ptd, enable_etdump=True, debug_buffer_size=0)
    method = program.load_method(method_name)
    for _ in range(repeats + 1):
        method.execute(args)
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "etdump.etdp"
        program.write_etdump_result_to_file(str(dump), str(Path(tmp) / "debug.bin"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Output Buffer not found": no tensors were asked for
            events = Inspector(etdump_path=str(dump)).event_blocks[-1].events
    per_name: dict[str, list[float]] = defaultdict(list)  # name -> summed time of each run
    columns: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if event.perf_data is None:
            continue
        runs = event.perf_data.raw[1:]  # drop the warm-up
        column = event.name if event.name in WRAPPERS else _column(event.name, event.is_delegated_op)
        for sums in (per_name[event.name], columns[column]):
            if not sums:
                sums.extend([0.0] * len(runs))
            for i, t in enumerate(runs):
                sums[i] += t
    med = {k: statistics.median(v) for k, v in columns.items()}
    total = med.pop("Method::execute")
    delegate = med.pop("DELEGATE_CALL", 0.0)
    med.pop("OPERATOR_CALL", None)
    med["delegate overhead"] = max(delegate - med.get("matmul", 0.0) - med.get("backend ops", 0.0), 0.0) \
        if "matmul" in med or "backend ops" in med else delegate
    # the runtime's own time: between calls, and each operator call's wrapper around its kernel
    med["runtime"] = max(total - delegate - sum(med.get(c, 0.0) for c in ("attention", "cache writes", "portable ops")), 0.0)
    ops = {k: statistics.median(v) for k, v in per_name.items() if k not in WRAPPERS}
    return CallProfile(label, tokens, total, {c: med.get(c, 0.0) for c in COLUMNS}, ops)


def profile_programs(programs_dir: Path, tokens: list[int], block: int, pos: int, repeats: int) -> list[CallProfile]:
    """Target calls of each T in `tokens` and one draft call with a block of `block` (new context: one tap; none
    without a draft), all at cache position `pos`."""
    from dflash_et.runtime.programs import load_programs

    ptd = programs_dir / "shared.ptd"
    ptd = ptd if ptd.exists() else None
    target, draft = load_programs(programs_dir)  # checks the pair and finds the draft (draft.pte, or target.pte)
    paths = (target.path, draft and draft.path)
    if draft is not None:
        width = draft.program.metadata(DRAFT_METHOD).input_tensor_meta(1).sizes()[-1]  # the taps' [1, n, k*H]
        block = min(block, draft.meta.max_block_len)
    del target, draft
    profiles = [profile_call(paths[0], ptd, TARGET_METHOD, [torch.zeros(1, t, dtype=torch.long), torch.arange(pos, pos + t)],
                             repeats, f"target T={t}", t) for t in tokens]
    if paths[1] is None:
        return profiles
    profiles.append(profile_call(paths[1], ptd, DRAFT_METHOD, [torch.zeros(1, block, dtype=torch.long), torch.zeros(1, 1, width),
                                                             torch.tensor([pos])], repeats, f"draft B={block}", block - 1))
    return profiles


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Milliseconds a call takes, median of `repeats` after one warm-up (the first call pays for caches and
    lazy setup that decoding pays once)."""
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def machine_roofline() -> dict:
    """This machine's read bandwidth (summing 1 GiB, larger than any cache) and fp32 matmul throughput
    (a 2048-square matmul), with every core, as torch reaches them."""
    from dflash_et.threads import all_cores

    with all_cores():
        x = torch.ones(1 << 28)
        bandwidth = x.numel() * 4 / (median_ms(x.sum, 5) / 1000)
        a = torch.randn(2048, 2048)
        flops = 2 * 2048 ** 3 / (median_ms(lambda: a @ a, 5) / 1000)
    return {"read_gb_s": bandwidth / 1e9, "fp32_gflops": flops / 1e9}


def linears_of(summary: dict) -> dict[str, dict | None]:
    """Each model's Linears from a package's export.json: its programs' `linears`, by model (the single layout's
    one program holds both); None for a model whose program predates them."""
    return {"target": None, "draft": None} | {k: v for s in summary.get("programs", {}).values()
                                              for k, v in s.get("linears", {}).items()}


def roofline_ms(linears: dict, tokens: int, machine: dict) -> float:
    """The least a call of `tokens` can take: its weight bytes at the read bandwidth, or its FLOPs at the
    fp32 throughput, whichever is larger."""
    return max(linears["bytes"] / machine["read_gb_s"] / 1e6, 2 * tokens * linears["parameters"] / machine["fp32_gflops"] / 1e6)


def table(profiles: list[CallProfile], linears: dict[str, dict | None], machine: dict, top: int = 8) -> str:
    """The markdown table of the calls (ms), their ratio to the first target call and their roofline."""
    head = "| call | total | x T=1 | " + " | ".join(COLUMNS) + " | roofline | of roofline |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 5)]
    first = profiles[0].total_ms
    for p in profiles:
        kind = "target" if p.label.startswith("target") else "draft"
        bound = roofline_ms(linears[kind], p.tokens, machine) if linears.get(kind) else None
        cells = [p.label, f"{p.total_ms:.2f}", f"{p.total_ms / first:.2f}"] + [f"{p.columns[c]:.2f}" for c in COLUMNS]
        cells += [f"{bound:.2f}", f"{bound / p.total_ms:.0%}"] if bound else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"machine: read {machine['read_gb_s']:.1f} GB/s, fp32 matmul {machine['fp32_gflops']:.0f} GFLOPS "
                 f"(torch, every core); linears: " + ", ".join(
                     f"{k} {v['parameters'] / 1e6:.1f}M parameters, {v['bytes'] / 1e6:.0f} MB" for k, v in linears.items() if v))
    for p in profiles:
        ops = sorted(p.ops.items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"{p.label}: " + ", ".join(f"{name} {ms:.2f}" for name, ms in ops))
    return "\n".join(lines)


def report(programs_dir: Path, tokens: list[int], block: int, pos: int, repeats: int) -> str:
    """The table of `profile_programs` on a package's programs, with this machine's roofline (measured first)."""
    summary = programs_dir / "export.json"
    if not (programs_dir / "target.pte").is_file() or not summary.is_file():
        raise UserError(f"{programs_dir} has no target.pte and export.json; point at a package stage's output "
                        "(artifacts/programs)")
    linears = linears_of(json.loads(summary.read_text()))
    machine = machine_roofline()
    text = table(profile_programs(programs_dir, tokens, block, pos, repeats), linears, machine)
    if not all(linears.values()):
        text += "\n(no roofline: these programs' export.json predates `linears`; export them again)"
    return text
