"""The suite's fixtures. Anything slow (training the small pair, lowering programs, building the C++ runner) happens
once per run, shared by pytest-xdist's workers; what tests build checkpoints and programs with is in
tests/tiny_checkpoints.py and tests/tiny_programs.py. Tests that need such a fixture are marked `slow`
(`pytest -m "not slow"`: the rest, for a quick loop)."""

import os
import sys
from pathlib import Path

import pytest

from dflash_et.checkpoints.fetch import fetch
from tests import REPO
from tests.family_targets import family_target
from tests.tiny_checkpoints import (DFLASH2, SMALL_DRAFT_TRAINING, SMALL_TARGET, SMALL_TARGET_TRAINING, gemma_draft,
                                    random_checkpoint, random_draft)
from tests.tiny_programs import (MAX_SEQ_LEN, PREFILL_CHUNK, REDUCED_VOCAB, SUCCESSOR_SCALE, TOOL_ROOM, WINDOW,
                                 build_programs, built_once)

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
# Test oracles (z-lab's `dflash`) are installed outside the runtime environment (see the Makefile).
sys.path.append(str(REPO / ".venv" / "oracles"))

# fixtures that train, lower programs or compile: a test that asks for one (or for one that does) is slow
BUILDS = {"trained_pair", "programs", "shared_programs", "single_programs", "quantized_shared_programs",
          "mixed_programs", "reduced_vocab_programs", "windowed_programs", "trained_dflash2_programs", "runner",
          "gemma_programs", "hybrid_programs", "small_pair", "target_alone_programs"}  # small_pair: test_frugal's


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {}).values()  # request.getfixturevalue(name)
        if BUILDS & ({*getattr(item, "fixturenames", ())} | {p for p in params if isinstance(p, str)}):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The built-in (target, draft) checkpoint directories with random weights, fetched as the pipeline does."""

    def build(root: Path) -> None:
        fetch("target", "builtin-random", root / "target")
        fetch("draft", "builtin", root / "draft", target_dir=root / "target")

    root = built_once(tmp_path_factory, "random-pair", build)
    return root / "target", root / "draft"


@pytest.fixture(scope="session")
def trained_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target, draft) directories of a small trained target and a draft trained for it, fetched as the pipeline does."""
    from functools import partial

    from dflash_et.checkpoints import builtin
    from dflash_et.training.train import TrainConfig, train_draft

    def build(root: Path) -> None:
        builtin.write_target(root / "source", shape=SMALL_TARGET, training=SMALL_TARGET_TRAINING)
        fetch("target", str(root / "source"), root / "target")
        fetch("draft", "train", root / "draft", target_dir=root / "target",
              train=partial(train_draft, config=TrainConfig(**SMALL_DRAFT_TRAINING)))

    root = built_once(tmp_path_factory, "trained-pair", build)
    return root / "target", root / "draft"


@pytest.fixture(scope="session")
def programs(trained_pair, tmp_path_factory) -> Path:
    """fp32 XNNPACK programs of the trained pair, lowered once per test run."""
    return built_once(tmp_path_factory, "xnnpack", lambda out: build_programs(trained_pair, out)) / "programs"


@pytest.fixture(scope="session")
def target_alone_programs(trained_pair, tmp_path_factory) -> tuple[Path, Path]:
    """(programs, draft dir) of the trained pair's target with model.draft: none: target.pte alone, and the marker
    fetch_draft writes in place of a draft."""
    def build(out: Path) -> None:
        fetch("draft", "none", out / "none", target_dir=trained_pair[0])
        build_programs((trained_pair[0], out / "none"), out, stock_forward=False)

    root = built_once(tmp_path_factory, "target-alone", build)
    return root / "programs", root / "none"


@pytest.fixture(scope="session")
def shared_programs(trained_pair, tmp_path_factory) -> Path:
    """The same with export.shared_weights: both .pte files read one shared.ptd."""
    return built_once(tmp_path_factory, "shared", lambda out: build_programs(trained_pair, out, shared_weights=True)) \
        / "programs"


@pytest.fixture(scope="session")
def single_programs(trained_pair, tmp_path_factory) -> Path:
    """The same pair with export.layout single: one target.pte with `forward`, `target` and `draft`."""
    return built_once(tmp_path_factory, "single", lambda out: build_programs(trained_pair, out, layout="single")) \
        / "programs"


@pytest.fixture(scope="session")
def quantized_shared_programs(trained_pair, tmp_path_factory) -> Path:
    """8da4w programs of the trained pair with export.shared_weights (one shared.ptd)."""
    return built_once(tmp_path_factory, "8da4w-shared",
                      lambda out: build_programs(trained_pair, out, quantize="8da4w", shared_weights=True,
                                                   stock_forward=False)) / "programs"


@pytest.fixture(scope="session")
def mixed_programs(programs, trained_pair, tmp_path_factory) -> Path:
    """`programs`' target.pte beside a draft.pte exported for another target (the same target, other layers)."""
    import json
    import shutil

    from dflash_et.export.config import ExportConfig
    from dflash_et.export.lower import export_program

    def build(out: Path) -> None:
        shutil.copytree(programs, out / "programs")
        (out / "programs" / "draft.pte").unlink()
        draft_dir = out / "draft"
        shutil.copytree(trained_pair[1], draft_dir)
        config = json.loads((draft_dir / "config.json").read_text())
        config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
        (draft_dir / "config.json").write_text(json.dumps(config))
        (draft_dir / "train_draft.json").unlink()
        export_program("draft", trained_pair[0], draft_dir, ExportConfig(max_seq_len=MAX_SEQ_LEN,
                                                                          prefill_chunk=PREFILL_CHUNK), out / "programs")

    return built_once(tmp_path_factory, "mixed", build) / "programs"


@pytest.fixture(scope="session")
def reduced_vocab_programs(programs, trained_pair, tmp_path_factory) -> Path:
    """`programs` with the trained draft exported with export.draft_vocab=REDUCED_VOCAB: its head over the tokens
    the target emitted most in the draft's training replies (token_counts.json)."""
    import shutil

    from dflash_et.export.config import ExportConfig
    from dflash_et.export.lower import export_program

    def build(out: Path) -> None:
        shutil.copytree(programs, out / "programs")
        export_program("draft", *trained_pair, ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK,
                                                            draft_vocab=REDUCED_VOCAB), out / "programs")

    return built_once(tmp_path_factory, "reduced-vocab", build) / "programs"


@pytest.fixture(scope="session")
def windowed_programs(programs, trained_pair, tmp_path_factory) -> Path:
    """`programs` with the trained draft exported with a context window of WINDOW (z-lab's sliding_window_size):
    its ring-buffer caches and a loop that feeds it only the taps it reads."""
    import json
    import shutil

    from dflash_et.export.config import ExportConfig
    from dflash_et.export.lower import export_program

    def build(out: Path) -> None:
        shutil.copytree(programs, out / "programs")
        draft_dir = shutil.copytree(trained_pair[1], out / "draft")
        config = json.loads((draft_dir / "config.json").read_text())
        config["dflash_config"]["sliding_window_size"] = WINDOW
        (draft_dir / "config.json").write_text(json.dumps(config))
        export_program("draft", trained_pair[0], draft_dir, ExportConfig(max_seq_len=MAX_SEQ_LEN,
                                                                          prefill_chunk=PREFILL_CHUNK), out / "programs")

    return built_once(tmp_path_factory, "windowed", build) / "programs"


@pytest.fixture(scope="session")
def trained_dflash2_programs(programs, trained_pair, tmp_path_factory) -> Path:
    """`programs`' target.pte beside a DFlash2 draft.pte made of the trained draft: its layers as trained, its
    convolutions the identity (as a new DFlash2 draft starts), and a random successor codebook whose pairwise scores
    move some walks off each position's top logit. The target accepts its proposals about as often as the DFlash
    draft's (a random draft's it rejects nearly all, which hides bugs), and a walk that left the pairwise scores out
    would propose other tokens."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file

    from dflash_et.checkpoints import zlab
    from dflash_et.export.config import ExportConfig
    from dflash_et.export.lower import export_program

    def build(out: Path) -> None:
        shutil.copytree(programs, out / "programs")
        config = json.loads((trained_pair[1] / "config.json").read_text())
        config["dflash_config"] |= DFLASH2
        config["architectures"] = [zlab.ARCHITECTURES["dflash2"]]
        weights = zlab.init_draft_weights(config, seed=0) | load_file(trained_pair[1] / "model.safetensors")
        shape = weights["candidate_selector.successor_codebook"].shape  # zero at init: a selector that adds nothing
        weights["candidate_selector.successor_codebook"] = SUCCESSOR_SCALE * torch.randn(
            shape, generator=torch.Generator().manual_seed(2))
        zlab.save_draft(out / "draft", config, weights)
        export_program("draft", trained_pair[0], out / "draft",
                       ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK), out / "programs")

    return built_once(tmp_path_factory, "trained-dflash2", build) / "programs"


@pytest.fixture(scope="session")
def gemma_programs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(programs, target, draft): fp32 XNNPACK programs of a small trained Gemma 4 target (tests/targets/gemma4:
    window 4, so the ring-buffer sliding caches wrap; it calls the tools a request declares, in Gemma 4's format) and
    a random draft, as the pipeline builds them. (Its layer scalars are 1: random ones are checked on the eager
    model, tests/test_model.py.)"""

    def build(root: Path) -> None:
        fetch("target", str(family_target("gemma4")), root / "target")
        build_programs((root / "target", gemma_draft(root / "draft", root / "target")), root, max_seq_len=TOOL_ROOM,
                       stock_forward=False)

    root = built_once(tmp_path_factory, "gemma-programs", build)
    return root / "programs", root / "target", root / "draft"


@pytest.fixture(scope="session")
def hybrid_programs(tmp_path_factory) -> tuple[Path, tuple[Path, Path]]:
    """(programs, (target, draft)): fp32 XNNPACK programs of a small trained hybrid (Qwen3.5) target
    (tests/targets/qwen3_5: it calls declared tools, in XML) and a random draft, as the pipeline builds them."""

    def build(root: Path) -> None:
        fetch("target", str(family_target("qwen3_5")), root / "target")
        build_programs((root / "target", random_draft(root / "draft", root / "target", num_layers=2)), root,
                       max_seq_len=TOOL_ROOM, stock_forward=False)

    root = built_once(tmp_path_factory, "hybrid-programs", build)
    return root / "programs", (root / "target", root / "draft")


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> Path:
    """dflash_runner, built once per test run (by the first worker to ask) as `make runner` builds it."""
    from filelock import FileLock

    from runner.toolchain import build_runner

    with FileLock(str(tmp_path_factory.getbasetemp().parent / "runner-build.lock")):
        return build_runner()
