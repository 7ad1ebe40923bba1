"""`dflash profile` (dflash_et.evaluate.profile): ExecuTorch's profiler read back per call, split into columns that add up, beside a
roofline from what export.json says each call computes and reads."""

import json

import pytest
import torch

from dflash_et.checkpoints.load import load_draft, load_target
from tests.tiny_checkpoints import checkpoint_facts
from tests.tiny_programs import MAX_SEQ_LEN
from dflash_et import cli
from dflash_et.evaluate import profile


def linear_parameters(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_export_records_what_a_call_computes_and_reads(programs, trained_pair):
    facts = checkpoint_facts(trained_pair)
    target = load_target(trained_pair[0], facts["target_layer_ids"], MAX_SEQ_LEN)
    draft = load_draft(trained_pair[1], target)
    linears = profile.linears_of(json.loads((programs / "export.json").read_text()))
    for kind, model in (("target", target), ("draft", draft)):
        assert linears[kind]["parameters"] == linear_parameters(model)  # the borrowed head included
        assert linears[kind]["bytes"] == 4 * linears[kind]["parameters"]  # fp32


def test_quantized_weights_are_counted_at_their_precision(quantized_shared_programs):
    summary = json.loads((quantized_shared_programs / "export.json").read_text())
    group = summary["config"]["group_size"]
    for linears in profile.linears_of(summary).values():
        assert linears["bytes"] == round(linears["parameters"] * (0.5 + 2 / group))  # 8da4w


def test_profile_splits_each_call_into_columns_that_add_up(programs):
    profiles = profile.profile_programs(programs, tokens=[1, 4], block=4, pos=8, repeats=2)
    assert [p.label for p in profiles] == ["target T=1", "target T=4", "draft B=4"]
    for p in profiles:
        assert p.total_ms > 0
        assert sum(p.columns.values()) == pytest.approx(p.total_ms, rel=1e-6)
        # this wheel's XNNPACK profiles its operators; attention runs on ExecuTorch's llama kernel
        assert p.columns["matmul"] > 0 and p.columns["attention"] > 0, p.columns
        assert any(name.startswith("Fully Connected") for name in p.ops)
        assert p.ops["llama::custom_sdpa.out"] == pytest.approx(p.columns["attention"])


def test_roofline_is_the_larger_of_memory_and_compute():
    linears, machine = {"parameters": 1_000_000, "bytes": 4_000_000}, {"read_gb_s": 10.0, "fp32_gflops": 100.0}
    assert profile.roofline_ms(linears, 1, machine) == pytest.approx(0.4)   # 4 MB at 10 GB/s
    assert profile.roofline_ms(linears, 64, machine) == pytest.approx(1.28)  # 128 MFLOP at 100 GFLOPS


def test_table_has_a_row_per_call_and_the_machine(programs):
    profiles = profile.profile_programs(programs, tokens=[1], block=2, pos=4, repeats=1)
    linears = profile.linears_of(json.loads((programs / "export.json").read_text()))
    text = profile.table(profiles, linears, {"read_gb_s": 10.0, "fp32_gflops": 100.0})
    rows = [line for line in text.splitlines() if line.startswith("| target") or line.startswith("| draft")]
    assert len(rows) == 2 and all(line.count("|") == len(profile.COLUMNS) + 6 for line in rows)
    assert "read 10.0 GB/s, fp32 matmul 100 GFLOPS" in text


def test_a_directory_without_programs_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["profile", str(tmp_path)])
    assert str(e.value) == f"error: {tmp_path} has no target.pte and export.json; point at a package stage's output " \
                           "(artifacts/programs)"
