"""A draft that attends a sliding window of its context (z-lab's `sliding_window_size`): read from its config,
against z-lab's own model, fed only the taps it reads, cached in ring buffers, trained and exported."""

import json
import shutil

import pytest
import torch

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.load import load_config
from dflash_et.checkpoints.pair import load_pair
from dflash_et.errors import CheckpointError
from dflash_et.runtime.generate import generate_ar, generate_dflash
from tests.tiny_checkpoints import chat_checkpoint, random_draft

WINDOW, BLOCK = 8, 8  # z-lab's torch model also hides block rows a window ahead (its MLX one does not): W >= B


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A random target and a draft for it whose every layer sees WINDOW positions back."""
    root = tmp_path_factory.mktemp("windowed")
    target = chat_checkpoint(root / "target", "qwen3")
    return target, random_draft(root / "draft", target, block=BLOCK, sliding_window_size=WINDOW)


def _settings(tmp_path, **keys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "dflash_config": {"mask_token_id": 1, "target_layer_ids": [0], **keys}}))
    return zlab.draft_settings(load_config(tmp_path))


def test_the_window_is_read_as_zlab_and_llama_cpp_write_it(tmp_path):
    assert _settings(tmp_path, sliding_window_size=64).context_window == 64
    assert _settings(tmp_path, use_swa=True, swa_window_size=32).context_window == 32
    assert _settings(tmp_path, swa_window_size=32).context_window is None  # llama.cpp: only with use_swa
    assert _settings(tmp_path).context_window is None
    with pytest.raises(CheckpointError, match="sliding_window_size 1 must be an integer of at least 2"):
        _settings(tmp_path, sliding_window_size=1)


def test_every_layer_gets_the_window_and_keeps_its_causality(windowed):
    _, draft, _ = load_pair(*windowed, max_seq_len=64)
    assert draft.context_window == WINDOW
    assert [(s.window, s.causal) for s in draft.args.layers] == [(WINDOW, False)] * len(draft.args.layers)
    _, plain, _ = load_pair(windowed[0], _without_window(windowed[1]), max_seq_len=64)
    assert plain.context_window is None


def _without_window(draft_dir):
    out = draft_dir.parent / "draft-full"
    if not out.exists():
        shutil.copytree(draft_dir, out)
        config = json.loads((out / "config.json").read_text())
        del config["dflash_config"]["sliding_window_size"]
        (out / "config.json").write_text(json.dumps(config))
    return out


def _rounds(seed: int = 0):
    """(new taps, block) per draft call, as decoding feeds them, over more context than the window."""
    g = torch.Generator().manual_seed(seed)
    return [(n, b, int(torch.randint(0, 300, (1,), generator=g))) for n, b in
            [(9, 8), (1, 4), (3, 2), (12, 8), (2, 8), (5, 3), (1, 8)]]


def test_the_windowed_draft_matches_zlab(windowed, tmp_path):
    """z-lab's DFlashDraftModel with every layer a non-causal sliding layer is the same draft."""
    from dflash import DFlashDraftModel

    target, draft, settings = load_pair(*windowed, max_seq_len=64)
    oracle_dir = shutil.copytree(windowed[1], tmp_path / "oracle")
    config = json.loads((oracle_dir / "config.json").read_text())
    config |= {"layer_types": ["sliding_attention"] * config["num_hidden_layers"], "sliding_window": WINDOW,
               "use_sliding_window": True, "is_causal": False}
    (oracle_dir / "config.json").write_text(json.dumps(config))
    oracle = DFlashDraftModel.from_pretrained(oracle_dir).eval()
    width = len(settings.target_layer_ids) * target.args.hidden_size
    g = torch.Generator().manual_seed(3)
    taps = torch.empty(1, 0, width)
    for n, b, anchor in _rounds():
        new = torch.randn(1, n, width, generator=g)
        start, taps = taps.shape[1], torch.cat([taps, new], dim=1)
        block = torch.tensor([[anchor] + [settings.mask_token_id] * (b - 1)])
        with torch.no_grad():
            ours = draft(block, new, torch.arange(start, start + n))
            c = taps.shape[1]
            hidden = oracle(position_ids=torch.arange(c + b)[None], noise_embedding=target.embed_tokens(block),
                            target_hidden=taps)
            ref = oracle.compute_logits(hidden[:, 1:], target.lm_head)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def _fed_only_what_it_reads(draft, settings, width, seed: int):
    """Logits of decoding-like rounds: each call's context starts no earlier than its block minus window - 1 (as
    generate_dflash feeds it), and each new round starts at the previous block (a rollback into it)."""
    g = torch.Generator().manual_seed(seed)
    taps, out, fed = torch.randn(1, 64, width, generator=g), [], 0
    for n, b, anchor in _rounds(seed):
        pos = fed + n  # the block's first position
        first = max(fed, pos - WINDOW + 1)
        block = torch.tensor([[anchor] + [settings.mask_token_id] * (b - 1)])
        with torch.no_grad():
            out.append(draft(block, taps[:, first:pos], torch.arange(first, pos)))
        fed = pos
    return out


def test_a_ring_cached_draft_left_without_unread_taps_equals_the_dense_one(windowed):
    """The llama ops' ring buffers (window + block - 1 rows) give the dense cache's logits when decoding
    leaves out the taps the window never reads and rolls back into each block."""
    target, dense, settings = load_pair(*windowed, max_seq_len=64)
    _, ring, _ = load_pair(*windowed, max_seq_len=64, ops="llama", ring=True, max_block=BLOCK)
    assert {layer.self_attn.cache.k_cache.shape[1] for layer in ring.layers} == {WINDOW + BLOCK - 1}
    width = len(settings.target_layer_ids) * target.args.hidden_size
    for ours, ref in zip(_fed_only_what_it_reads(ring, settings, width, 1),
                         _fed_only_what_it_reads(dense, settings, width, 1)):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


class _Spy:
    """A draft that records how many taps each call is fed."""

    def __init__(self, draft):
        self.draft, self.fed, self.context_window = draft, [], draft.context_window

    def __call__(self, tokens, hidden, input_pos):
        self.fed.append(hidden.shape[1])
        return self.draft(tokens, hidden, input_pos)


def test_decoding_feeds_a_windowed_draft_only_what_it_reads(windowed):
    target, draft, settings = load_pair(*windowed, max_seq_len=96)
    prompt = list(range(10, 40))
    spy = _Spy(draft)
    out = generate_dflash(target, spy, prompt, 24, set(), 96, 16, BLOCK, settings.mask_token_id)
    assert spy.fed[0] == WINDOW - 1 and max(spy.fed) <= WINDOW - 1
    assert out.tokens == generate_ar(target, prompt, 24, set(), 96, 16).tokens
    # fed everything, the same draft proposes the same tokens: what was left out was never read
    everything = _Spy(load_pair(*windowed, max_seq_len=96)[1])
    everything.context_window = None
    full = generate_dflash(target, everything, prompt, 24, set(), 96, 16, BLOCK, settings.mask_token_id)
    assert everything.fed[0] == len(prompt)
    assert [r.accepted for r in full.rounds] == [r.accepted for r in out.rounds]


def test_training_with_a_window_sees_only_the_window(windowed):
    """Training's packed blocks go through the same masks: a tap older than the window moves no logit."""
    from dflash_et.training.blocks import pack
    from dflash_et.training.data import Sequence

    target, draft, settings = load_pair(*windowed, max_seq_len=64)
    width = len(settings.target_layer_ids) * target.args.hidden_size
    g = torch.Generator().manual_seed(5)
    seq = Sequence(torch.randint(0, 300, (40,), generator=g), torch.randn(39, width, generator=g), 10)
    anchor = torch.tensor([30])
    batch = pack([seq], [anchor], BLOCK, settings.mask_token_id, 7.0)
    every_row = torch.arange(batch.tokens.shape[1])

    def logits(taps):
        with torch.no_grad():
            return draft.packed(batch.tokens, taps[batch.ctx_pos][None], batch.ctx_pos, batch.block_pos, batch.mask,
                                every_row)[1]

    base = logits(seq.taps)
    old, inside = seq.taps.clone(), seq.taps.clone()
    old[:30 - WINDOW + 1] = torch.randn(30 - WINDOW + 1, width, generator=g)
    inside[30 - WINDOW + 1] += 1.0
    torch.testing.assert_close(logits(old), base)
    assert not torch.allclose(logits(inside), base)


def test_training_packs_only_the_taps_a_window_reads_and_the_loss_is_the_same(windowed):
    from dflash_et.training.blocks import draft_loss, pack
    from dflash_et.training.data import Sequence

    target, draft, settings = load_pair(*windowed, max_seq_len=96)
    width = len(settings.target_layer_ids) * target.args.hidden_size
    g = torch.Generator().manual_seed(6)
    seqs = [Sequence(torch.randint(0, 300, (n,), generator=g), torch.randn(n - 1, width, generator=g), 5)
            for n in (80, 40)]
    anchors = [torch.tensor([50, 70]), torch.tensor([20, 30])]
    trimmed = pack(seqs, anchors, BLOCK, settings.mask_token_id, 7.0, draft.context_window)
    whole = pack(seqs, anchors, BLOCK, settings.mask_token_id, 7.0)
    assert trimmed.ctx_pos.tolist() == [*range(50 - WINDOW + 1, 70), *range(20 - WINDOW + 1, 30)]
    assert whole.ctx_pos.tolist() == [*range(70), *range(30)]  # no window: all before the last anchor
    with torch.no_grad():
        torch.testing.assert_close(draft_loss(draft)(trimmed), draft_loss(draft)(whole))


def test_train_draft_writes_the_window_into_the_draft(tmp_path, windowed):
    from dflash_et.training.train import TrainConfig, new_draft
    from dflash_et.checkpoints.load import load_target

    target_dir = windowed[0]
    target = load_target(target_dir, [1, 2], 64)
    config, draft = new_draft(target_dir, target, TrainConfig(num_layers=2, sliding_window=WINDOW, mask_token_id=4,
                                                              max_seq_len=64))
    assert config["dflash_config"]["sliding_window_size"] == WINDOW and draft.context_window == WINDOW


def test_windowed_programs_match_the_eager_pair_and_stay_lossless(windowed_programs, programs, trained_pair):
    """The exported draft takes only the taps its window reads (its caches ring buffers): the same logits as the
    eager draft through validate's calls, and DFlash through the programs is plain greedy decoding."""
    from dflash_et.data.chat import encode_chat, tokenizer
    from dflash_et.data.prompts import builtin_prompts
    from dflash_et.runtime.engine import Engine
    from tests.tiny_programs import WINDOW, numerics, planned_arenas

    checked, (target_p, draft_p), _ = numerics(windowed_programs, (trained_pair[0], windowed_programs.parent / "draft"))
    assert draft_p.meta.context_window == WINDOW
    ring, full = (sum(planned_arenas(p / "draft.pte")["draft"]) for p in (windowed_programs, programs))
    assert ring < full  # its KV caches hold WINDOW + block - 1 rows, not max_seq_len
    assert checked["worst"]["draft_rel"].value < 1e-4 and checked["token_agreement"] == 1.0
    engine = Engine(windowed_programs)
    engine.eos_ids = set()  # every reply runs its 40 tokens, several windows past its prompt
    tok = tokenizer(windowed_programs)
    accepted = 0
    for ids in (encode_chat(tok, r["prompt"]) for r in builtin_prompts(3)):  # the chats the pair was trained on
        assert len(ids) > WINDOW
        out = engine.dflash(ids, 40)
        assert out.tokens == engine.ar(ids, 40).tokens
        accepted += sum(r.accepted for r in out.rounds)
    assert accepted > 0
