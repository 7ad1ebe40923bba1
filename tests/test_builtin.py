"""The built-in pair: deterministic, loadable by transformers, and in z-lab's draft layout."""

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from dflash_et.checkpoints import builtin
from dflash_et.data.chat import reply_text
from dflash_et.data.tool_chats import as_text, tool_call, tool_chat


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "fingerprint.json"}


def test_same_bytes_twice(pair, tmp_path):
    """Made again, the pair is byte-identical; fetching stored the fingerprint of exactly those bytes."""
    from dflash_et.checkpoints.load import compute_checkpoint_id

    target, draft = pair
    builtin.write_target(tmp_path / "t", trained=False)
    builtin.write_draft(tmp_path / "d", tmp_path / "t")
    assert files(tmp_path / "t") == files(target)
    assert files(tmp_path / "d") == files(draft)
    for fetched, made in ((target, tmp_path / "t"), (draft, tmp_path / "d")):
        assert json.loads((fetched / "fingerprint.json").read_text())["checkpoint_id"] == compute_checkpoint_id(made)


def test_target_loads_with_transformers(pair):
    target, _ = pair
    config = AutoConfig.from_pretrained(target)
    assert config.model_type == "qwen3" and not config.tie_word_embeddings
    assert config.num_key_value_heads < config.num_attention_heads  # GQA, like Qwen3-4B
    assert config.head_dim * config.num_attention_heads != config.hidden_size
    model = AutoModelForCausalLM.from_pretrained(target)
    assert "q_norm" in dict(model.named_modules())["model.layers.0.self_attn"]._modules
    eos = json.loads((target / "generation_config.json").read_text())["eos_token_id"]
    tok = AutoTokenizer.from_pretrained(target)
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos


def test_tokenizer_round_trips_and_has_chat_template(pair):
    tok = AutoTokenizer.from_pretrained(pair[0])
    text = "Ada has 12 apples and buys 7 more. ünïcode ✓ def f(x):\n    return x"
    assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_the_chat_template_renders_tools_and_calls_as_the_tool_chats_teach(pair):
    """A tool chat carried on to its result renders its call as the reply the model learns to write (one rule for
    both: the template), its tools in the system turn and the result as a user turn; no tools, no system text."""
    tok = AutoTokenizer.from_pretrained(pair[0])
    rng = random.Random(0)
    while len((chat := tool_chat(rng))[0]) == 1:
        pass
    messages, tools, _ = chat
    rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                       enable_thinking=False)
    name, arguments = (messages[1]["tool_calls"][0]["function"][k] for k in ("name", "arguments"))
    assert rendered.startswith("<|im_start|>system\n" + builtin.TOOLS_INTRO + "\n" + json.dumps(tools[0]))
    assert "<|im_start|>assistant\n" + tool_call(name, arguments) + "<|im_end|>\n" in rendered
    assert f"<|im_start|>user\n<tool_response>\n{messages[2]['content']}\n</tool_response><|im_end|>\n" in rendered
    assert "system" not in tok.apply_chat_template(messages[:1], tokenize=False)


def test_a_tool_chat_is_learned_in_the_call_format_of_the_targets_own_template():
    """The reply a built-in target learns is its template's rendering of the assistant's message: a call that its
    family's server parser (ExecuTorch's) reads back as the call made, for Qwen3 the Hermes text the built-in
    tokenizer's merges were trained on; a read-out answer is its text in every family."""
    from executorch.examples.llm_server.python.tool_parsers import (GemmaToolCallDetector, HermesDetector,
                                                                    QwenFunctionCallDetector)

    from dflash_et.checkpoints import families

    parsers = {"qwen3": HermesDetector, "gemma4": GemmaToolCallDetector, "qwen3_5": QwenFunctionCallDetector}
    for name, family in families.builtins().items():
        tok, rng, calls = builtin.build_tokenizer(**family.builtin.tokenizer), random.Random(0), 0
        for messages, tools, reply in (tool_chat(rng) for _ in range(40)):
            written = reply_text(tok, messages, reply, tools)
            if name == "qwen3":
                assert written == as_text(reply)
            if reply["content"]:
                assert written == reply["content"], name
                continue
            call = reply["tool_calls"][0]["function"]
            parsed = parsers[name]().detect_and_parse(written, {t["function"]["name"]: t["function"]["parameters"]
                                                                for t in tools})
            assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(call["name"], call["arguments"])], \
                (name, written)
            assert not parsed.normal_text.strip(), (name, written)
            calls += 1
        assert 10 < calls < 30
    marked = builtin.build_tokenizer(chat_template="{% for m in messages %}{{ m.content }}{{ '.' if loop.last }}"
                                                   "{% endfor %}")  # the last turn rendered apart
    with pytest.raises(ValueError, match="renders earlier turns differently once a reply follows"):
        reply_text(marked, [{"role": "user", "content": "hi"}], {"role": "assistant", "content": "yes"})


def test_draft_matches_zlab_layout(pair):
    """Same keys and shapes as z-lab's own DFlashDraftModel built from the draft's config."""
    from dflash import DFlashDraftModel

    target, draft = pair
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert {"mask_token_id", "target_layer_ids"} <= set(config["dflash_config"])
    tok = AutoTokenizer.from_pretrained(target)
    assert tok.convert_ids_to_tokens(config["dflash_config"]["mask_token_id"]) == "<|mask|>"
    with torch.device("meta"):
        zlab = DFlashDraftModel(Qwen3Config.from_pretrained(draft))
    expected = {k: tuple(v.shape) for k, v in zlab.state_dict().items()}
    with safe_open(draft / "model.safetensors", "pt") as f:
        ours = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert ours == expected
    assert "embed_tokens.weight" not in ours and "lm_head.weight" not in ours


def test_default_layer_ids_match_zlab():
    from dflash.model import build_target_layer_ids

    from dflash_et.checkpoints.zlab import default_target_layer_ids

    for n, l in [(36, 5), (28, 5), (6, 2), (32, 1), (40, 8)]:
        assert default_target_layer_ids(n, l) == build_target_layer_ids(n, l)
    for n in range(1, 5):  # where z-lab's formula leaves the target, the taps stay inside it
        assert all(0 <= i < n for i in default_target_layer_ids(n, 2)), n


def test_target_training_lowers_the_loss():
    """The built-in target's training step (the full run takes minutes; here three steps)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = builtin.build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=builtin.VOCAB_SIZE, **{**builtin.TARGET_SHAPE, "num_hidden_layers": 2}))
    chat = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nSure!<|im_end|>\n")
    ids = torch.tensor([chat])
    before = model(input_ids=ids, labels=ids).loss.item()
    builtin.train_target(model, tok, {**builtin.TARGET_TRAINING, "steps": 3, "samples": 64, "long_steps": 0})
    assert not model.training
    assert model(input_ids=ids, labels=ids).loss.item() < before


def test_long_chats_train_the_reply_after_a_document(monkeypatch):
    """The second phase's steps each add a chat whose question follows a document of other samples, its loss on
    the reply alone."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = builtin.build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=builtin.VOCAB_SIZE, **{**builtin.TARGET_SHAPE, "num_hidden_layers": 1}))
    seq, reply = builtin._chat(tok, "Say hi.", "Hi!")
    assert tok.decode(seq[reply:]).startswith("Hi!") and reply > 0
    fed = []
    loss = builtin._loss
    monkeypatch.setattr(builtin, "_loss", lambda m, batch, from_reply: fed.append(
        (len(batch), len(batch[0][0]), from_reply)) or loss(m, batch, from_reply))
    builtin.train_target(model, tok, {**builtin.TARGET_TRAINING, "steps": 2, "batch": 2, "samples": 64,
                                      "long_steps": 2, "long_batch": 3, "long_tokens": 700, "tool_batch": 5})
    long = [n for _, n, from_reply in fed if from_reply]
    assert [size for size, _, _ in fed] == [2, 5, 2, 5, 3, 1, 5, 3, 1, 5]  # tool chats in every step of both phases
    assert len(long) == 2 and all(256 - 60 < n <= 700 + 20 for n in long)  # a document is whole texts (<60 tokens)
    with torch.no_grad():  # from_reply: the next-token loss of the reply's tokens alone
        logits = model(input_ids=torch.tensor([seq])).logits[0]
        expected = torch.nn.functional.cross_entropy(logits[reply - 1:-1], torch.tensor(seq[reply:]))
        torch.testing.assert_close(loss(model, [(seq, reply)], True), expected)
        assert not torch.allclose(loss(model, [(seq, reply)], False), expected)
