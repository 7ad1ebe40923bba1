"""The GGUF fixture writes files transformers' own GGUF loader reads back to the source model, so tests of
the project's GGUF import can use transformers' load as the reference."""

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from tests import gguf_fixture as gf
from tests.gguf_fixture import CHATML_TEMPLATE, ENDOFTEXT, IM_END, IM_START, tiny_llama, tiny_qwen3, write_gguf

# every id range: the specials, the byte alphabet and merges up to the last row
IDS = torch.tensor([[1, 9, 100, 37, 300, 2, 0, 255, 256, 400, 511, 7, 1, 64, 128, 500]])

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Héllo there, 2+2? 你好 <think>"},
        {"role": "assistant", "content": "4.\n\nDone!"}]


@pytest.fixture(scope="module")
def models():
    """Built once: (arch, tied) -> (model, tokenizer)."""
    return {("llama", True): tiny_llama(tie=True), ("llama", False): tiny_llama(tie=False, seed=1),
            ("qwen3", False): tiny_qwen3(tie=False), ("qwen3", True): tiny_qwen3(tie=True, seed=1)}


def load(path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(IDS).logits


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen3", False), ("qwen3", True)])
def test_f32_loads_back_exactly(models, tmp_path, arch, tied):
    model, tokenizer = models[arch, tied]
    path = write_gguf(tmp_path, model, tokenizer, "F32")
    assert path == tmp_path / f"{arch}-F32.gguf"
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert ("output.weight" in names) is not tied  # llama.cpp writes no head when it is the embedding
    if arch == "qwen3":
        assert {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names

    loaded = load(path)
    assert type(loaded) is type(model)
    assert loaded.config.tie_word_embeddings is tied
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
        assert getattr(loaded.config, key) == getattr(model.config, key), key
    assert loaded.config.rope_parameters["rope_theta"] == model.config.rope_parameters["rope_theta"]
    assert loaded.config.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)
    torch.testing.assert_close(logits(loaded), logits(model), atol=1e-5, rtol=0)


def test_weights_move_the_logits(models, tmp_path, monkeypatch):
    """The comparison above would catch a writer that skipped llama's Q/K permutation (which transformers
    undoes on load): the fixture's weights make the logits depend on it."""
    model, tokenizer = models["llama", True]
    monkeypatch.setattr(gf, "llama_permute", lambda weights, *heads: weights)
    diff = (logits(load(write_gguf(tmp_path, model, tokenizer))) - logits(model)).abs().max()
    assert diff > 1.0


def test_quantized_types_are_close_but_not_equal(models, tmp_path):
    """Q8_0 / Q4_0 / F16 store 2-D weights in that type and norms in F32, as llama.cpp does; their logits
    are near the source's, coarser with fewer bits."""
    model, tokenizer = models["llama", False]
    reference = logits(model)
    errors = {}
    for qtype in ("F16", "Q8_0", "Q4_0"):
        path = write_gguf(tmp_path, model, tokenizer, qtype)
        types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
        want = gf.QTYPES[qtype][0]
        assert types["token_embd.weight"] == types["output.weight"] == types["blk.1.ffn_down.weight"] == want
        assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == gguf.GGMLQuantizationType.F32
        errors[qtype] = (logits(load(path)) - reference).abs().max().item()
    scale = reference.abs().max().item()
    assert 0 < errors["F16"] < errors["Q8_0"] < errors["Q4_0"], errors
    assert errors["Q8_0"] < 0.05 * scale, (errors, scale)
    assert errors["Q4_0"] < 0.5 * scale, (errors, scale)


def test_tokenizer_loads_back(models, tmp_path):
    model, tokenizer = models["llama", True]
    path = write_gguf(tmp_path, model, tokenizer, "Q8_0")
    loaded = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)

    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text.startswith(IM_START + "system\n")
    ids = tokenizer(text).input_ids
    assert loaded(text).input_ids == ids
    assert loaded.decode(ids) == text
    assert loaded.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False) == ids
    assert loaded.chat_template == CHATML_TEMPLATE
    assert loaded.eos_token == IM_END and loaded.pad_token == ENDOFTEXT
    assert len(loaded) == len(tokenizer) == model.config.vocab_size
    for special in (ENDOFTEXT, IM_START, IM_END):  # CONTROL tokens stay whole
        assert loaded(special).input_ids == [tokenizer.convert_tokens_to_ids(special)]


def test_transformers_takes_no_head_dim_from_qwen3(tmp_path):
    """A transformers 5.24 quirk the fixture works around (`tiny_qwen3` uses head_dim 128): it rebuilds a
    qwen3 GGUF with Qwen3Config's default head_dim, whatever `qwen3.attention.key_length` says. If this
    starts loading, the caveat in `write_gguf`'s docstring can go."""
    tokenizer = gf.tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    path = write_gguf(tmp_path, Qwen3ForCausalLM(config), tokenizer)
    assert gguf.GGUFReader(path).fields["qwen3.attention.key_length"].contents() == 16
    with pytest.raises(RuntimeError, match="mismatched"):
        load(path)
