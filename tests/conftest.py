"""Shared fixtures. Anything slow (generating the pair, loading models, lowering) happens once per session."""

import os
from pathlib import Path

import pytest

from dflash_et.checkpoint import fetch

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The built-in (target, draft) checkpoint directories with random weights, fetched as the pipeline does."""
    root = tmp_path_factory.mktemp("weights")
    fetch("target", "builtin-random", root / "target")
    fetch("draft", "builtin", root / "draft", target_dir=root / "target")
    return root / "target", root / "draft"


def random_checkpoint(path: Path, family: str, shard: bool = False, **overrides) -> Path:
    """A random-weight Hugging Face checkpoint of `family` ("qwen3" or "llama"), saved by transformers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[family]
    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1)
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**shape, **overrides})).eval()
    model.save_pretrained(path, max_shard_size="100KB" if shard else "5GB")
    return path


# (family, overrides, sharded): GQA, MHA, MQA, tied and untied heads, head_dim != hidden/heads,
# biases, and Llama-3.1 rope scaling that actually bends frequencies at these lengths.
TARGET_CONFIGS = {
    "qwen3-gqa-headdim": ("qwen3", dict(head_dim=32, tie_word_embeddings=False), False),
    "qwen3-tied-mha": ("qwen3", dict(num_key_value_heads=4, tie_word_embeddings=True), False),
    "llama31-mqa-sharded": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)), True),
    "llama-bias-headdim": ("llama", dict(head_dim=24, attention_bias=True, mlp_bias=True,
                                         tie_word_embeddings=False), False),
}


def build_programs(pair, out: Path, **export_params) -> Path:
    """Export both programs and package them into `out`, as the pipeline's stages do."""
    from dflash_et.export import PROGRAM_KINDS, ExportConfig, export_program, package

    config = ExportConfig.from_params({"max_seq_len": 128, "prefill_chunk": 16, **export_params})
    for kind in PROGRAM_KINDS:
        export_program(kind, *pair, config, out / "build" / kind)
    (out / "programs").mkdir()
    package([out / "build" / kind for kind in PROGRAM_KINDS], out / "programs")
    return out / "programs"


@pytest.fixture(scope="session")
def programs(pair, tmp_path_factory) -> Path:
    """fp32 XNNPACK programs of the built-in pair, lowered once per session."""
    return build_programs(pair, tmp_path_factory.mktemp("xnnpack"))


@pytest.fixture(scope="session")
def shared_programs(pair, tmp_path_factory) -> Path:
    """The same with export.shared_weights: both .pte files read one shared.ptd."""
    return build_programs(pair, tmp_path_factory.mktemp("shared"), shared_weights=True)
