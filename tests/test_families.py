"""The target families: one module each in checkpoints/families/, found by listing the folder; load, z-lab's
draft layout, the built-in targets and GGUF targets all go through the registry, so a new family is one file."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, MistralConfig, MistralForCausalLM

from dflash_et.checkpoints import builtin, families, from_gguf, zlab
from dflash_et.checkpoints.check import check_target
from dflash_et.checkpoints.families import llama
from dflash_et.checkpoints.families.base import Family, attention
from dflash_et.checkpoints.load import eos_ids, load_config, load_target, model_args
from dflash_et.errors import CheckpointError
from tests.tiny_checkpoints import random_draft
from tests.gguf_fixture import tiny_llama, write_gguf
from tests.test_model import TAPS, cache_calls, check_against_hf

PACKAGE = Path(families.__file__).parent
SUPPORTED = {"qwen3", "llama", "gemma4_text", "gemma4", "qwen3_5_text", "qwen3_5"}


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test (which may add a family or take one away)."""
    monkeypatch.setattr(families, "REGISTRY", dict(families.REGISTRY))
    return families.REGISTRY


def test_every_family_file_is_registered_and_every_target_type_has_one_family():
    files = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "base"))
    assert files == sorted(families.REGISTRY) == ["gemma4", "llama", "qwen3", "qwen3_5"]
    assert set(families.model_types()) == SUPPORTED and len(families.model_types()) == len(SUPPORTED)
    for model_type in SUPPORTED:
        assert model_type in families.claiming(model_type).model_types
    assert families.claiming("gpt2") is None


def test_an_unknown_model_type_is_refused_in_one_line():
    with pytest.raises(CheckpointError) as e:
        families.family_of(MistralConfig())
    message = str(e.value)
    assert message.startswith("target model_type 'mistral' is not supported; use one of (") and "\n" not in message
    assert all(repr(t) in message for t in SUPPORTED)
    with pytest.raises(CheckpointError, match=r"^config model_type 'mistral' is not supported"):
        model_args(MistralConfig())


def test_a_family_cannot_claim_a_taken_model_type(registry):
    with pytest.raises(ValueError, match=r"\['llama'\] already registered"):
        families.register(Family(name="other", model_types=("llama",), layer=llama.layer))


@pytest.mark.parametrize("name", sorted(families.builtins()))
def test_each_family_round_trips_its_builtin_shape(name, tmp_path):
    """write_target(family=name) writes the family's shape: read back, its family maps it to the stack the
    config it made in memory maps to, and the fetch checks pass."""
    made = families.REGISTRY[name].builtin
    builtin.write_target(tmp_path, trained=False, family=name)
    written = json.loads((tmp_path / "config.json").read_text())
    assert all(written[k] == v for k, v in made.shape.items() if k in written)  # others become per-layer fields
    config = load_config(tmp_path)
    assert families.family_of(config) is families.REGISTRY[name]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    in_memory, eos, _ = made.config(tokenizer, {"vocab_size": builtin.VOCAB_SIZE, **made.shape})
    args = model_args(config)
    assert args == model_args(in_memory) and eos_ids(tmp_path) == sorted(eos)
    assert (args.hidden_size, args.num_layers, args.vocab_size) == (
        made.shape["hidden_size"], made.shape["num_hidden_layers"], builtin.VOCAB_SIZE)
    check_target(tmp_path)
    assert builtin.RECOMMENDED_SAMPLING[name] == made.sampling
    assert made.source is None or builtin.TARGET_SOURCES[made.source] == name


def mistral_layer(c, i: int, kind: str, causal: bool | None):
    """Mistral: Llama's stack, every layer sliding when the config has a window."""
    return attention(c, "sliding_attention" if c.sliding_window else kind, causal)


def test_a_new_family_is_one_file(registry, tmp_path):
    """All a family needs is its `Family`: registered (as a file in families/ is), a Mistral checkpoint loads,
    matches transformers through its sliding window, and gets a z-lab draft that loads against it."""
    config = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
                           max_position_embeddings=256)
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path / "target")
    with pytest.raises(CheckpointError, match="'mistral' is not supported"):
        load_target(tmp_path / "target", TAPS, max_seq_len=64)
    families.register(Family(name="mistral", model_types=("mistral",), layer=mistral_layer))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    target = load_target(tmp_path / "target", TAPS, max_seq_len=64)
    assert {layer.self_attn.spec.window for layer in target.layers} == {6}
    check_against_hf(target, hf, TAPS, cache_calls(300))
    draft = random_draft(tmp_path / "draft", tmp_path / "target")
    assert zlab.draft_settings(load_config(draft)).target_layer_ids


def test_the_llama_family_alone_serves_gguf_targets(registry, tmp_path):
    """The GGUF path (SmolLM2's) names no family: a llama GGUF is taken while llama.py's family is registered,
    and refused, with llama gone from the architectures offered, once it is not."""
    model, tokenizer = tiny_llama(tie=True)
    path = write_gguf(tmp_path / "tiny.gguf", model, tokenizer, "F32")
    assert from_gguf.check_gguf(path, "target tiny") == ("llama", torch.float32)
    del registry["llama"]
    with pytest.raises(CheckpointError, match=r"GGUF architecture 'llama' is not supported; GGUF targets can be") as e:
        from_gguf.check_gguf(path, "target tiny")
    assert "'llama'" not in str(e.value).split("can be")[1] and "'qwen3'" in str(e.value)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
           {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_family_files_import_only_downwards():
    """A family file uses base.py, the models and errors: never load, zlab, builtin or another family."""
    allowed = ("dflash_et.checkpoints.families.base", "dflash_et.models.", "dflash_et.errors")
    for path in PACKAGE.glob("*.py"):
        if path.stem == "__init__":
            continue
        ours = {m for m in _imports(path) if m.startswith("dflash_et")}
        assert all(m.startswith(allowed) for m in ours), (path.name, ours)
    assert all(not m.startswith("dflash_et.checkpoints.families.") or m.endswith(".base")
               for m in _imports(PACKAGE / "__init__.py"))


def test_no_family_chains_outside_the_family_files():
    """Branching on a model_type belongs in that family's file."""
    chain = re.compile(r"model_type[\"']?\)?\s*(==|!=|(not )?in\s*[(\[{])|family\s*[!=]=\s*['\"]")
    root = PACKAGE.parent.parent
    offenders = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if PACKAGE not in p.parents
                 for i, line in enumerate(p.read_text().splitlines(), 1) if chain.search(line)]
    assert offenders == []
