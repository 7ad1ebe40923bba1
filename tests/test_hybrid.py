"""Hybrid targets (Qwen3.5: Gated DeltaNet + gated full attention): the target through both DeltaNet
backends against transformers across chunked prefill, verify calls with partial acceptance and
rollback; the programs against the eager model; greedy DFlash over them token-identical to plain greedy
with a draft that is right only sometimes (so rounds roll back by every amount); one-line errors."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from dflash_et.checkpoints import builtin
from dflash_et.checkpoints.load import load_target, model_args
from dflash_et.errors import ExportError, ProgramError
from dflash_et.export.config import ExportConfig
from dflash_et.export.lower import export_program
from dflash_et.models.deltanet import DeltaNetSpec, GatedDeltaNet
from dflash_et.evaluate.validate import validate
from dflash_et.runtime.generate import generate_ar, generate_dflash
from dflash_et.runtime.programs import load_programs
from tests.tiny_checkpoints import random_checkpoint, random_draft
from tests.tiny_programs import assert_program_matches_eager, validate_config
from tests.test_model import check_against_hf

TAPS = [0, 1, 3]  # a DeltaNet layer, a full-attention layer, and the last (after the final norm)


def forward_calls(vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(tokens, start) calls that go forward, as decoding does: chunked prefill, a decode step, verify
    calls kept in part (2 of 6, 2 of 5, 4 of 8), one kept whole, one dropped whole (the next starts where it
    did), then a new sequence at 0."""
    g = torch.Generator().manual_seed(seed)

    def toks(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    return [(toks(4), 0), (toks(4), 4), (toks(2), 8), (toks(1), 10), (toks(6), 11), (toks(5), 13), (toks(8), 15),
            (toks(3), 19), (toks(2), 22), (toks(2), 22), (toks(7), 24), (toks(5), 0), (toks(3), 5)]


# float32 DeltaNets drift from the exact result with the sequence (here, at position 30, transformers' own
# float32 logits are 2.2e-4 off its float64 ones; ours 7.6e-5): the oracle runs in float64
TOL = 3e-5


def float64_oracle(ckpt):
    """transformers in float64, its outputs cast to float32 (the dtype `check_against_hf` compares)."""
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float64).eval()

    def run(ids, output_hidden_states):
        out = hf(ids, output_hidden_states=output_hidden_states)
        return SimpleNamespace(logits=out.logits.float(), hidden_states=[h.float() for h in out.hidden_states])

    run.config = hf.config
    return run


@pytest.fixture(scope="module")
def hybrid_target(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "target", "qwen3_5_text")


def test_config_reads_as_hybrid(hybrid_target):
    layers = model_args(AutoModelForCausalLM.from_pretrained(hybrid_target).config).layers
    assert [isinstance(spec, DeltaNetSpec) for spec in layers] == [True, False, True, False]
    assert layers[1].output_gate and layers[1].qk_norm


@pytest.mark.parametrize("ops, max_call, verify_call", [("torch", None, None), ("torch", None, 4), ("llama", 8, None),
                                                        ("llama", 8, 4)])
def test_hybrid_target_matches_transformers(hybrid_target, ops, max_call, verify_call):
    """Each call equals transformers on the whole sequence so far (no cache): the DeltaNet state after a
    partly kept verify call is the state after exactly the kept tokens, replayed; after a call kept whole
    (longer ones too: verify_call 4) it is that call's final state."""
    target = load_target(hybrid_target, TAPS, max_seq_len=64, ops=ops, max_call=max_call, verify_call=verify_call)
    check_against_hf(target, float64_oracle(hybrid_target), TAPS, forward_calls(300), TOL)


def test_a_new_sequence_ignores_what_the_state_buffers_held(hybrid_target):
    """ExecuTorch does not zero a program's mutable buffers: whatever they hold (NaN here) must not reach a
    sequence that starts at 0, nor leak from rows a later replay masks out."""
    target = load_target(hybrid_target, TAPS, max_seq_len=64, ops="llama", max_call=8)
    for layer in target.modules():
        if isinstance(layer, GatedDeltaNet):
            for name in ("state", "conv_in", "keys", "values", "decays", "betas"):
                getattr(layer, name).fill_(float("nan"))
            layer.length.fill_(8)
    check_against_hf(target, float64_oracle(hybrid_target), TAPS, forward_calls(300, seed=4), TOL)


def test_multimodal_wrapper_loads_its_text_model(tmp_path):
    """The released checkpoints' layout: `model.language_model.*`, a top-level `lm_head`, a vision tower
    and multi-token-prediction weights (`mtp.*`) that DFlash does not use."""
    ckpt = random_checkpoint(tmp_path / "wrapper", "qwen3_5", tie_word_embeddings=False)
    weights = load_file(ckpt / "model.safetensors")
    assert "lm_head.weight" in weights and any(k.startswith("model.visual.") for k in weights)
    save_file(weights | {"mtp.fc.weight": torch.ones(2, 2), "mtp.norm.weight": torch.ones(2)},
              ckpt / "model.safetensors", metadata={"format": "pt"})
    hf = float64_oracle(ckpt)  # transformers' text model, from the wrapper's weights
    check_against_hf(load_target(ckpt, TAPS, max_seq_len=64), hf, TAPS, forward_calls(300, seed=1), TOL)


def test_builtin_hybrid_target_is_qwen3_5(tmp_path):
    builtin.write_target(tmp_path, trained=False, family="qwen3_5", shape=dict(num_hidden_layers=4))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text"
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    check_against_hf(load_target(tmp_path, TAPS, max_seq_len=64), float64_oracle(tmp_path), TAPS,
                     forward_calls(builtin.VOCAB_SIZE), TOL)



def test_hybrid_programs_match_the_eager_model(hybrid_programs):
    programs_dir, pair = hybrid_programs
    target_p, _ = load_programs(programs_dir)
    assert target_p.meta.recurrent_state is True
    eager = load_target(pair[0], target_p.meta.target_layer_ids, target_p.meta.max_context_len)
    assert_program_matches_eager(target_p, eager, forward_calls(builtin.VOCAB_SIZE, seed=3))


class SometimesRightDraft:
    """A draft that proposes the target's own greedy continuation with one wrong token per round, at a
    place that cycles through the block: every round is kept in part, by a different amount each time."""

    def __init__(self, sequence: list[int], block: int, vocab: int):
        self.sequence, self.block, self.vocab, self.round = sequence, block, vocab, 0

    def __call__(self, tokens, hidden, input_pos):
        anchor = int(input_pos[-1]) + 1  # the block's first token sits right after the new context
        wrong = self.round % (self.block + 1)  # block + 1 rounds in a cycle: one of them entirely right
        self.round += 1
        proposals = self.sequence[anchor + 1:anchor + tokens.shape[1]]
        proposals += [0] * (tokens.shape[1] - 1 - len(proposals))
        if wrong < len(proposals):
            proposals[wrong] = (proposals[wrong] + 1) % self.vocab
        return torch.nn.functional.one_hot(torch.tensor([proposals]), self.vocab).float()


def test_greedy_dflash_over_hybrid_programs_is_lossless(hybrid_programs):
    programs_dir, _ = hybrid_programs
    target_p, draft_p = load_programs(programs_dir)
    block, max_seq_len, chunk = draft_p.meta.max_block_len, target_p.meta.max_context_len, target_p.meta.max_seq_len
    prompt = list(range(40, 73))  # two prefill chunks
    plain = generate_ar(target_p, prompt, 60, set(), max_seq_len, chunk)
    draft = SometimesRightDraft(prompt + plain.tokens, block, builtin.VOCAB_SIZE)
    run = generate_dflash(target_p, draft, prompt, 60, set(), max_seq_len, chunk, block, draft_p.meta.mask_token_id)
    assert run.tokens == plain.tokens
    kept = {r.accepted for r in run.rounds}
    assert set(range(block)) <= kept  # every amount of rollback, from none to the whole block
    real = generate_dflash(target_p, draft_p, prompt, 60, set(), max_seq_len, chunk, block, draft_p.meta.mask_token_id)
    assert real.tokens == plain.tokens


def test_validate_passes_on_hybrid_programs(hybrid_programs):
    programs_dir, (target, draft) = hybrid_programs
    report = validate(programs_dir, target, draft, validate_config(prompts=2, max_new_tokens=16))
    assert report["failures"] == [] and report["lossless"]
    assert report["target_rel_err"] < 1e-4


def test_hybrid_program_refuses_calls_that_go_back_or_skip(hybrid_programs):
    target_p, _ = load_programs(hybrid_programs[0])
    target_p(torch.tensor([[1, 2, 3, 4]]), torch.arange(4))
    target_p(torch.tensor([[5, 6]]), torch.arange(4, 6))
    for start in (3, 7):  # before the previous call, past its end: the state there is gone, or never was
        with pytest.raises(ProgramError, match=rf"must start at 0 \(a new sequence\) or within the previous call "
                                               rf"\(positions \(4, 6\)\), not at {start}"):
            target_p(torch.tensor([[1]]), torch.tensor([start]))
    target_p(torch.tensor([[1]]), torch.tensor([0]))  # a new sequence
    target_p(torch.arange(16)[None], torch.arange(16))  # a prefill chunk, longer than a verify (8)
    with pytest.raises(ProgramError, match="may keep all of the previous call or at most its first 8 tokens, not 10"):
        target_p(torch.tensor([[1]]), torch.tensor([10]))
    target_p(torch.tensor([[1]]), torch.tensor([16]))


def test_mlx_export_of_a_hybrid_target_is_refused(hybrid_programs, tmp_path):
    _, (target, draft) = hybrid_programs
    with pytest.raises(ExportError, match="Gated DeltaNet layers export for xnnpack or portable only"):
        export_program("target", target, draft, ExportConfig(backend="mlx"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_deltanet_layer_names_the_op_sets_it_runs_on():
    with pytest.raises(ValueError, match="Gated DeltaNet layers run on the torch and llama op sets, not mlx"):
        GatedDeltaNet(64, DeltaNetSpec(2, 4, 8, 8, 4), 1e-6, 8, 4, ops="mlx")


@pytest.mark.parametrize("ring", [True, False])
def test_deltanet_buffers_follow_the_longest_call_not_the_sliding_cache(hybrid_target, ring):
    """`export.sliding_cache: full` keeps the attention's sliding layers full length; the DeltaNet layers'
    inputs are still sized by the longest call (they once grew to max_seq_len with it)."""
    target = load_target(hybrid_target, TAPS, max_seq_len=64, ops="llama", max_call=8, verify_call=4, ring=ring)
    deltanets = [m for m in target.modules() if isinstance(m, GatedDeltaNet)]
    assert deltanets and all(m.conv_in.shape[1] == m.spec.conv_kernel - 1 + 8 and m.keys.shape[2] == 4
                             for m in deltanets)


def test_cpp_runner_runs_hybrid_programs(hybrid_programs, runner):
    """The runner's own llama::gated_delta_rule kernel: plain and DFlash, the Python engine's tokens and rounds."""
    from dflash_et.runtime.cpp_runner import CppEngine
    from dflash_et.runtime.engine import Engine

    programs_dir, _ = hybrid_programs
    prompts = [list(range(40, 73)), [7, 8, 9]]
    python = Engine(programs_dir)
    theirs = [python.dflash(ids, 24, 8) for ids in prompts] + [python.ar(ids, 24) for ids in prompts]
    with CppEngine(programs_dir, runner, threads=1) as cpp:
        ours = [cpp.dflash(ids, 24, 8) for ids in prompts] + [cpp.ar(ids, 24) for ids in prompts]
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens
        assert [(r.verified, r.accepted) for r in a.rounds] == [(r.verified, r.accepted) for r in b.rounds]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_eager_twin_of_a_half_precision_export_keeps_the_state_in_float32(tmp_path, dtype):
    """validate's eager twin is loaded by export's own code (loading.load_models): half-precision weights, the Gated
    DeltaNet state in float32 as in the program (casting the whole fp32 model to half made it half, and it failed)."""
    from dflash_et.export.loading import load_models

    target_dir = random_checkpoint(tmp_path / "target", "qwen3_5_text", vocab_size=builtin.VOCAB_SIZE)
    builtin.build_tokenizer().save_pretrained(target_dir)
    draft_dir = random_draft(tmp_path / "draft", target_dir, num_layers=1)
    target, draft, settings = load_models(target_dir, draft_dir, ExportConfig(dtype=dtype), 64)
    layers = [m for m in target.modules() if isinstance(m, GatedDeltaNet)]
    assert layers and all(m.state.dtype == torch.float32 for m in layers)
    assert target.embed_tokens.weight.dtype == draft.fc.weight.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with torch.no_grad():
        logits, taps = target(torch.tensor([[1, 5, 7, 9]]), torch.arange(4))
        proposals = draft(torch.tensor([[9] + [settings.mask_token_id] * 3]), taps, torch.arange(4))
    assert torch.isfinite(logits).all() and torch.isfinite(proposals).all()
