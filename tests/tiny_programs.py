"""Programs for tests: the test programs' export settings, building them once per run (shared by pytest-xdist's
workers), and reading them back (numerics against the eager pair, planned arenas, validate's config)."""

import os
from pathlib import Path


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(dir)` once per test run, even when pytest-xdist runs several workers: the first worker
    builds under a file lock in the run's shared temp directory, the others reuse it."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by this run's workers
    out = root / f"shared-{name}"
    with FileLock(str(out) + ".lock"):
        if not (out / ".done").exists():
            build(out)
            (out / ".done").touch()
    return out


def assert_program_matches_eager(program, eager, calls) -> None:
    """(tokens, start) calls through target.pte and its eager twin: the same logits and taps."""
    import torch

    for tokens, start in calls:
        x, pos = torch.tensor([tokens]), torch.arange(start, start + len(tokens))
        with torch.no_grad():
            ref_logits, ref_taps = eager(x, pos)
        logits, taps = program(x, pos)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(taps, ref_taps, rtol=1e-4, atol=1e-4)


MAX_SEQ_LEN, PREFILL_CHUNK = 128, 16  # the test programs' export settings


# the cache of programs that `dflash serve`'s tests serve: ExecuTorch's contract suite asks for a 128-token reply
# after a prompt that declares a tool (155 tokens in the built-in template)
TOOL_ROOM = 320


def planned_arenas(pte: Path) -> dict[str, list[int]]:
    """Each compute method's memory-planned arenas (no public API reads them; exir's own deserializer does)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    from dflash_et.metadata import DRAFT_METHOD, STOCK_METHOD, TARGET_METHOD

    program = deserialize_pte_binary(pte.read_bytes())
    return {plan.name: list(plan.non_const_buffer_sizes) for plan in getattr(program, "program", program).execution_plan
            if plan.name in (STOCK_METHOD, TARGET_METHOD, DRAFT_METHOD)}


def numerics(programs_dir: Path, pair: tuple[Path, Path], export_config=None):
    """compare_numerics of the programs against the eager pair (quantized like the export when it was)."""
    from dflash_et.checkpoints.pair import load_pair
    from dflash_et.export.recipes import quantize
    from dflash_et.evaluate.validate import compare_numerics
    from dflash_et.runtime.programs import load_programs

    progs = load_programs(programs_dir)
    eager = load_pair(*pair, max_seq_len=progs[0].meta.max_context_len)
    if export_config:
        quantize(eager[0], export_config)
        quantize(eager[1], export_config)
    prompts = [[1, 2, 3, 4, 5] * 7, [9, 8, 7]]
    return compare_numerics(progs, eager, prompts, ["a", "b"]), progs, eager


QUICK_SAMPLING_CHECK = {"samples": 100, "prompts": 1}  # validate.sampling for tests about validate's other checks


def validate_config(**params):
    """validate's config for a test: the statistical sampling check at 100 samples (tests/test_sampled_programs.py
    runs it at full size), everything else as given."""
    from dflash_et.evaluate.validate import ValidateConfig

    return ValidateConfig.from_params({"sampling": QUICK_SAMPLING_CHECK, **params})


def build_programs(pair, out: Path, **export_params) -> Path:
    """Export both programs and package them into `out`, as the pipeline's stages do. (Fixtures whose tests never
    call the target's stock `forward` pass stock_forward=False: it doubles the target's lowering time.)"""
    from dflash_et.export.config import PROGRAM_KINDS, ExportConfig
    from dflash_et.export.lower import export_program
    from dflash_et.export.package import package

    config = ExportConfig.from_params({"max_seq_len": MAX_SEQ_LEN, "prefill_chunk": PREFILL_CHUNK, **export_params})
    for kind in PROGRAM_KINDS:
        export_program(kind, *pair, config, out / "build" / kind)
    (out / "programs").mkdir(parents=True)
    package([out / "build" / kind for kind in PROGRAM_KINDS], out / "programs", pair[0])
    return out / "programs"


def flat_cost_curve(target, draft, max_block: int, max_seq_len: int, mask_token_id: int | None, prefill_chunk: int,
                    repeats: int = 5, programs: str = ""):
    """A stand-in for `measure_cost_curve` (its signature): verifying costs what a plain step does, a draft call half
    that, as on a device with spare compute. Tests that assert what `auto` does plan by it, since a curve timed once
    beside another test worker can say drafting never pays (CI saw tau_auto 1.03-1.56 on tiny programs)."""
    from dflash_et.runtime.cost_curve import CostCurve

    return CostCurve([64], [[1.0] * max_block], [[0.5] * (max_block - 1)], programs=programs)


REDUCED_VOCAB = 512  # reduced_vocab_programs' draft head: a quarter of the built-in vocabulary


WINDOW = 16  # windowed_programs' draft window: shorter than the test prompts


# trained_dflash2_programs' successor codebook: pairwise scores of about 1.4 logits, about a fifth of the walk's
# choices off the top logit (eager: 68 of 354 at blocks 2, 5 and 8)
SUCCESSOR_SCALE = 100.0
