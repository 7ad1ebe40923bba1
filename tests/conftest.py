"""Shared fixtures. Anything slow (generating the pair, loading models, lowering) happens once per session."""

import os
import sys
from pathlib import Path

import pytest

from dflash_et.checkpoints.fetch import fetch

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
REPO = Path(__file__).resolve().parents[1]
# Test oracles (z-lab's `dflash`) are installed outside the runtime environment (see the Makefile).
sys.path.append(str(REPO / ".venv" / "oracles"))


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The built-in (target, draft) checkpoint directories with random weights, fetched as the pipeline does."""

    def build(root: Path) -> None:
        fetch("target", "builtin-random", root / "target")
        fetch("draft", "builtin", root / "draft", target_dir=root / "target")

    root = built_once(tmp_path_factory, "random-pair", build)
    return root / "target", root / "draft"


# A target small enough to train in seconds, and a draft trained for it: DFlash through the programs then
# accepts several proposals per round (a random draft accepts almost none, and random weights hide bugs
# such as identical norms in both programs).
SMALL_TARGET = dict(hidden_size=96, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24)
# no long chats; tool calls for dflash serve's tests
SMALL_TARGET_TRAINING = dict(steps=300, batch=16, samples=2000, long_steps=0, tool_batch=4)
SMALL_DRAFT_TRAINING = dict(steps=500, num_prompts=96, heldout=6, max_new_tokens=40, block_size=8, anchors=8, batch=4,
                            max_seq_len=256, lr=3e-3, num_layers=1)


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


def checkpoint_facts(pair: tuple[Path, Path]) -> dict:
    """What a pair's own files say the programs must report: tests read these instead of repeating constants."""
    import json

    target = json.loads((pair[0] / "config.json").read_text())
    draft = json.loads((pair[1] / "config.json").read_text())
    eos = json.loads((pair[0] / "generation_config.json").read_text())["eos_token_id"]
    return {"vocab_size": target["vocab_size"], "hidden_size": target["hidden_size"], "eos_ids": sorted(eos),
            "mask_token_id": draft["dflash_config"]["mask_token_id"], "block_size": draft["block_size"],
            "target_layer_ids": draft["dflash_config"]["target_layer_ids"]}


GEMMA_SHAPE = dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                   hidden_size_per_layer_input=0, sliding_window=4, final_logit_softcapping=30.0,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                                "sliding_attention", "full_attention"], num_hidden_layers=6)
# Qwen3.5's layout in small: DeltaNet layers with twice the value heads of key heads and key dim != value
# dim, gated full-attention layers with partial rotary (a quarter of head_dim 32)
QWEN3_5_SHAPE = dict(head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=24, linear_conv_kernel_dim=4, full_attention_interval=2,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))


def random_checkpoint(path: Path, family: str, shard: bool = False, **overrides) -> Path:
    """A random-weight Hugging Face checkpoint of `family` (qwen3, llama, gemma4_text, gemma4: Gemma 4's
    multimodal wrapper, qwen3_5_text: Qwen3.5's hybrid text model, or qwen3_5: its multimodal wrapper with
    a tiny vision tower), saved by transformers. Norm weights, Gemma's layer scalars and the DeltaNet
    layers' time-step biases are randomized too: left at their initial values, a model that skips or
    swaps them would still match."""
    import torch
    from transformers import (Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig,
                              LlamaConfig, LlamaForCausalLM, Qwen3_5Config, Qwen3_5ForCausalLM,
                              Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM)

    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1)
    if family.startswith("gemma4"):
        shape |= GEMMA_SHAPE
    if family.startswith("qwen3_5"):
        shape |= QWEN3_5_SHAPE
    configs = {"qwen3": Qwen3Config, "llama": LlamaConfig, "qwen3_5_text": Qwen3_5TextConfig, "qwen3_5": Qwen3_5TextConfig}
    config = configs.get(family, Gemma4TextConfig)(**{**shape, **overrides})
    model_cls = {"qwen3": Qwen3ForCausalLM, "llama": LlamaForCausalLM, "gemma4_text": Gemma4ForCausalLM,
                 "gemma4": Gemma4ForConditionalGeneration, "qwen3_5_text": Qwen3_5ForCausalLM,
                 "qwen3_5": Qwen3_5ForConditionalGeneration}[family]
    if family == "gemma4":
        config = Gemma4Config(text_config=config.to_dict(), vision_config=None, audio_config=None)
    if family == "qwen3_5":
        config = Qwen3_5Config(text_config=config.to_dict(), vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=config.hidden_size),
            tie_word_embeddings=config.tie_word_embeddings)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("norm.weight", "layer_scalar", "dt_bias")):
                t.copy_(torch.empty_like(t).uniform_(0.5, 1.5))
    model.save_pretrained(path, max_shard_size="100KB" if shard else "5GB")
    return path


def random_draft(path: Path, target_dir: Path, num_layers: int = 3, block: int = 8, **dflash) -> Path:
    """A draft in z-lab's layout for `target_dir` (for a Gemma 4 target, z-lab's Gemma 4 layout), mask token
    4, with random weights and norms; `dflash` keys go into its dflash_config (DFlash2's make a DFlash2 draft)."""
    import json

    import torch

    from dflash_et.checkpoints import zlab

    config = zlab.draft_config(json.loads((target_dir / "config.json").read_text()), 4, num_layers, block)
    config["dflash_config"] |= dflash
    if "selector_top_k" in dflash:
        config["architectures"] = [zlab.ARCHITECTURES["dflash2"]]
    g = torch.Generator().manual_seed(1)
    weights = {k: (v if v.any() else torch.randn(v.shape, generator=g) * 0.02) * 5 if v.dim() == 2  # DFlash2's
               else torch.empty_like(v).uniform_(0.5, 1.5, generator=g)                          # zero inits too
               for k, v in zlab.init_draft_weights(config, seed=0).items()}
    zlab.save_draft(path, config, weights)
    return path


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


# (family, overrides, sharded): GQA, MHA, MQA, tied and untied heads, head_dim != hidden/heads,
# biases, Llama-3.1 rope scaling that actually bends frequencies at these lengths, and sliding-window
# layers (a window shorter than the test's calls).
TARGET_CONFIGS = {
    "qwen3-gqa-headdim": ("qwen3", dict(head_dim=32, tie_word_embeddings=False), False),
    "qwen3-tied-mha": ("qwen3", dict(num_key_value_heads=4, tie_word_embeddings=True), False),
    "llama31-mqa-sharded": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)), True),
    "llama-bias-headdim": ("llama", dict(head_dim=24, attention_bias=True, mlp_bias=True,
                                         tie_word_embeddings=False), False),
    "qwen3-sliding-window": ("qwen3", dict(use_sliding_window=True, sliding_window=5, max_window_layers=2), False),
    # Gemma 4 31B's layout in small: sliding and full layers with their own head dims, KV heads and RoPE,
    # K = V on full layers, softcapped logits; the window (4) shorter than the calls
    "gemma4-text": ("gemma4_text", {}, False),
    "gemma4-multimodal-sharded": ("gemma4", dict(attention_k_eq_v=False, num_global_key_value_heads=2), True),
}


MAX_SEQ_LEN, PREFILL_CHUNK = 128, 16  # the test programs' export settings


LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  *(f"<|reserved_special_token_{i}|>" for i in range(4))]
LLAMA_TEMPLATE = ("{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}"
                  "<|eot_id|>{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
                  "\n\n{%- endif %}")
QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def chat_checkpoint(path: Path, family: str, **overrides) -> Path:
    """A local checkpoint laid out as the real ones are, whose tokenizer has no mask token (as no real Qwen3,
    Llama or Gemma tokenizer has): Qwen3's has fewer tokens than embedding rows, Llama 3's fills every row
    and reserves special tokens. `overrides` go to its config (random_checkpoint)."""
    from dflash_et.checkpoints import builtin

    if family == "qwen3":
        tok = builtin.build_tokenizer(QWEN3_SPECIALS, "<|im_end|>", "<|endoftext|>", vocab_size=600)
        vocab, eos = 640, ["<|im_end|>", "<|endoftext|>"]
    else:
        tok = builtin.build_tokenizer(LLAMA_SPECIALS, "<|eot_id|>", "<|end_of_text|>", LLAMA_TEMPLATE, vocab_size=600)
        vocab, eos = len(tok), ["<|eot_id|>", "<|end_of_text|>"]
    eos_ids = [tok.convert_tokens_to_ids(t) for t in eos]
    random_checkpoint(path, family, vocab_size=vocab, eos_token_id=eos_ids, bos_token_id=eos_ids[1], **overrides)
    tok.save_pretrained(path)
    return path


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


@pytest.fixture(scope="session")
def programs(trained_pair, tmp_path_factory) -> Path:
    """fp32 XNNPACK programs of the trained pair, lowered once per test run."""
    return built_once(tmp_path_factory, "xnnpack", lambda out: build_programs(trained_pair, out)) / "programs"


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


REDUCED_VOCAB = 512  # reduced_vocab_programs' draft head: a quarter of the built-in vocabulary


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


WINDOW = 16  # windowed_programs' draft window: shorter than the test prompts


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


DFLASH2 = dict(conv_kernel_size=4, conv_group_size=8, selector_rank=8, selector_top_k=6)  # the tests' DFlash2 drafts
# trained_dflash2_programs' successor codebook: pairwise scores of about 1.4 logits, about a fifth of the walk's
# choices off the top logit (eager: 68 of 354 at blocks 2, 5 and 8)
SUCCESSOR_SCALE = 100.0


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
def runner(tmp_path_factory) -> Path:
    """dflash_runner, built once per test run (by the first worker to ask) as `make runner` builds it."""
    from filelock import FileLock

    from runner.toolchain import build_runner

    with FileLock(str(tmp_path_factory.getbasetemp().parent / "runner-build.lock")):
        return build_runner()
