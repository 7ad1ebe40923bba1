"""Gemma 4: the target through every attention backend against transformers, z-lab's Gemma 4 draft
layout (sliding layers causal inside the block, one full layer, softcapped logits, the target's
embedding scale) against a from-scratch reference and z-lab's `dflash`, and one-line errors."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.check import check_pair
from dflash_et.checkpoints.load import load_config, load_draft, load_target, model_args
from dflash_et.errors import CheckpointError
from tests.tiny_checkpoints import GEMMA_DRAFT_BLOCK as DRAFT_BLOCK, gemma_draft, random_checkpoint
from tests.tiny_programs import validate_config
from tests.test_model import TAPS, cache_calls, check_against_hf, draft_rounds, reference_draft


@pytest.fixture(scope="module")
def gemma_target(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("gemma") / "target", "gemma4_text")


@pytest.mark.parametrize("ops, ring", [("llama", False), ("llama", True), ("mlx", False)])
def test_gemma_target_through_the_backends_matches_transformers(gemma_target, ops, ring):
    """The exported attention (ExecuTorch's llama ops, with full-length or ring-buffer sliding caches;
    MLX's ops) across prefill past the window, verify and rollback; the dense cache is covered with the
    other families in test_model."""
    hf = AutoModelForCausalLM.from_pretrained(gemma_target).eval()
    target = load_target(gemma_target, TAPS, max_seq_len=64, ops=ops, max_call=8, ring=ring)
    caches = [layer.self_attn.cache for layer in target.layers]
    rows = [c.k_cache.shape[2 if c.heads_first else 1] for c in caches]
    assert rows == ([11, 11, 64, 11, 11, 64] if ring else [64] * 6)
    check_against_hf(target, hf, TAPS, cache_calls(hf.config.vocab_size, seed=2))


def test_gemma_draft_layout(gemma_target, tmp_path):
    """z-lab's Gemma 4 draft: sliding layers then a full one, twice the target's window, softcap 30."""
    draft = load_config(gemma_draft(tmp_path / "draft", gemma_target))
    layers = model_args(draft, causal=zlab.draft_settings(draft).causal).layers
    assert [(s.causal, s.window) for s in layers] == [(True, 8), (True, 8), (False, None)]
    assert zlab.draft_settings(draft).logit_softcap == 30.0


@pytest.mark.parametrize("embed_scale", [None, 1.0])
def test_gemma_draft_matches_reference(gemma_target, tmp_path, embed_scale):
    """Default: the block is embedded at the target's scale, sqrt(hidden); `embed_scale` in dflash_config
    overrides it (1.0 is dflash 0.1.0's torch model)."""
    extra = {} if embed_scale is None else {"embed_scale": embed_scale}
    draft_dir = gemma_draft(tmp_path / "draft", gemma_target, **extra)
    target = load_target(gemma_target, [1, 3, 4], max_seq_len=64)
    draft = load_draft(draft_dir, target)
    config, settings = load_config(draft_dir), zlab.draft_settings(load_config(draft_dir))
    w = load_file(draft_dir / "model.safetensors")
    embed, head = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    scale = target.args.hidden_size ** 0.5 if embed_scale is None else embed_scale
    width = len(settings.target_layer_ids) * target.args.hidden_size
    draft_rounds(draft, settings, width, lambda taps, block: reference_draft(w, config, embed, head, taps, block, 0, scale),
                 vocab=target.args.vocab_size)


def test_gemma_draft_matches_zlab(gemma_target, tmp_path):
    from dflash.model import DFlashDraftModel, _make_cache

    draft_dir = gemma_draft(tmp_path / "draft", gemma_target)
    target = load_target(gemma_target, [1, 3, 4], max_seq_len=64)
    draft = load_draft(draft_dir, target)
    settings = zlab.draft_settings(load_config(draft_dir))
    ref = DFlashDraftModel.from_pretrained(draft_dir).eval()
    width = len(settings.target_layer_ids) * target.args.hidden_size

    def oracle(taps, block):  # z-lab applies its window only through its cache: a fresh one, whole context
        c, b = taps.shape[1], block.shape[1]
        embedded = target.embed_tokens(block) * target.args.hidden_size ** 0.5
        hidden = ref(position_ids=torch.arange(c + b)[None], noise_embedding=embedded, target_hidden=taps,
                     past_key_values=_make_cache(ref.config), use_cache=True)
        return ref.compute_logits(hidden[:, 1:], target.lm_head)

    draft_rounds(draft, settings, width, oracle, seed=3, vocab=target.args.vocab_size)


def test_gemma_errors_are_one_line(gemma_target, tmp_path):
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    (wrapper / "config.json").write_text(json.dumps({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"]}))
    with pytest.raises(CheckpointError, match="gemma4 config without text_config"):
        load_config(wrapper)
    ple = random_checkpoint(tmp_path / "ple", "gemma4_text", hidden_size_per_layer_input=8)
    with pytest.raises(CheckpointError, match=r"per-layer embeddings .* are not supported"):
        load_target(ple, [1], max_seq_len=16)
    other = random_checkpoint(tmp_path / "wide", "gemma4_text", hidden_size=96)
    draft = gemma_draft(tmp_path / "draft", other)
    with pytest.raises(CheckpointError, match="does not fit target .*draft hidden_size 96 != target hidden_size 64"):
        check_pair(gemma_target, draft)


def test_builtin_gemma_pair_and_the_embed_scale_setting(tmp_path):
    """builtin-gemma fetches as a Gemma 4 checkpoint (tokenizer, chat template, mask token 4); a draft
    fetched with model.draft_embed_scale carries it, and without it embeds at the target's sqrt(hidden)."""
    from dflash_et.checkpoints import builtin
    from dflash_et.checkpoints.fetch import fetch

    builtin.write_target(tmp_path / "source", trained=False, family="gemma4")
    fetch("target", str(tmp_path / "source"), tmp_path / "target")
    config = load_config(tmp_path / "target")
    assert config.model_type == "gemma4_text" and zlab.choose_mask_token(tmp_path / "target", config.vocab_size) == 4
    target = load_target(tmp_path / "target", [1], max_seq_len=16)
    for scale, expected in [(None, config.hidden_size ** 0.5), (1.0, 1.0)]:
        out = tmp_path / f"draft-{scale}"
        fetch("draft", str(gemma_draft(tmp_path / f"src-{scale}", tmp_path / "target")), out,
              target_dir=tmp_path / "target", embed_scale=scale)
        assert load_draft(out, target).args.embed_scale == pytest.approx(expected)


def test_the_builtin_gemma_chat_format_is_gemma_4s():
    """The built-in Gemma 4 target's chat template writes Gemma 4's turns, the empty thought channel that thinking
    off opens, and calls that ExecuTorch's Gemma tool parser reads back as the call made (a string and a number)."""
    from executorch.examples.llm_server.python.tool_parsers import GemmaToolCallDetector

    from dflash_et.checkpoints import builtin
    from dflash_et.checkpoints.families import gemma4

    tok = builtin.build_tokenizer(**gemma4.FAMILY.builtin.tokenizer)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}, "days": {"type": "integer"}}}}}
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "sunny"}, {"role": "user", "content": "Thanks."}]
    text = tok.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    assert text.startswith("<bos><|turn>system\n<|tool>declaration:get_weather{") and \
        text.endswith("<|turn>user\nThanks.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"), text
    written = text[text.index("<|tool_call>"):text.index("<tool_call|>") + len("<tool_call|>")]
    parsed = GemmaToolCallDetector().detect_and_parse(written, {"get_weather": tool["function"]["parameters"]})
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Paris", "days": 2})]
    for marker in ("<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker


def test_gemma_target_program_matches_transformers(gemma_programs):
    """target.pte itself (ring-buffer sliding layers, llama ops, XNNPACK) against transformers' Gemma 4."""
    from dflash_et.runtime.programs import TargetProgram

    programs, target_dir, _ = gemma_programs
    program = TargetProgram(programs / "target.pte")
    assert json.loads((programs / "export.json").read_text())["config"]["sliding_cache"] == "ring"
    hf = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    # XNNPACK's fp32 kernels sum in another order than torch: 1e-4 of the largest value, not 1e-5
    check_against_hf(program, hf, program.meta.target_layer_ids, cache_calls(hf.config.vocab_size, seed=4), tol=1e-4)


def test_gemma_programs_validate(gemma_programs):
    """The validate stage's checks on the Gemma pair: both programs against the eager models over prefill,
    decode, verify and rollback, and DFlash over the programs lossless against plain greedy decoding."""
    from dflash_et.evaluate.validate import validate

    programs, target_dir, draft_dir = gemma_programs
    report = validate(programs, target_dir, draft_dir, validate_config(prompts=2, max_new_tokens=40))
    assert report["failures"] == [] and report["lossless"], report


def test_cpp_runner_on_the_gemma_pair(gemma_programs, runner):
    """The C++ runner through ring-buffer sliding layers (llama::custom_sdpa under an explicit mask, the ring
    wrapping at window 4) and softcapped logits: the Python engine's tokens and rounds."""
    from dflash_et.runtime.cpp_runner import CppEngine
    from dflash_et.runtime.engine import Engine

    programs, _, _ = gemma_programs
    python = Engine(programs)
    prompts = [[7, 3, 9, 12, 4, 30, 31, 2, 8, 8, 15], list(range(40, 70))]
    theirs = [(python.ar(ids, 30), python.dflash(ids, 30, DRAFT_BLOCK)) for ids in prompts]
    with CppEngine(programs, runner, threads=1) as cpp:
        ours = [(cpp.ar(ids, 30), cpp.dflash(ids, 30, DRAFT_BLOCK)) for ids in prompts]
    for (ar, dflash), (ar_py, dflash_py) in zip(ours, theirs):
        assert ar.tokens == ar_py.tokens and dflash.tokens == dflash_py.tokens == ar_py.tokens
        assert [r.accepted for r in dflash.rounds] == [r.accepted for r in dflash_py.rounds]
