"""Greedy DFlash over the eager models: token-for-token the target's own greedy output."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dflash_et.checkpoints.pair import load_pair
from dflash_et.data.corpus import samples
from dflash_et.runtime.generate import generate_ar, generate_dflash

MAX_SEQ_LEN = 256


@pytest.fixture(scope="module")
def models(pair):
    return load_pair(*pair, max_seq_len=MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def prompts(pair):
    tok = AutoTokenizer.from_pretrained(pair[0])
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                    enable_thinking=False, tokenize=False)
            for _, p, _ in samples(8, seed=123)], tok


def encode(prompts):
    texts, tok = prompts
    return [tok.encode(t) for t in texts]


def ar(models, prompt, n=24, eos=frozenset(), max_seq_len=MAX_SEQ_LEN):
    return generate_ar(models[0], prompt, n, set(eos), max_seq_len, prefill_chunk=16)


def dflash(models, prompt, block, n=24, eos=frozenset(), draft=None, max_seq_len=MAX_SEQ_LEN):
    target, real_draft, settings = models
    return generate_dflash(target, draft or real_draft, prompt, n, set(eos), max_seq_len, 16, block,
                           settings.mask_token_id)


@pytest.fixture(scope="module")
def plain(models, prompts) -> list[tuple[list[int], list[int]]]:
    """(prompt, plain greedy decoding's 24 tokens) of the first four prompts: what every block must give."""
    return [(ids, ar(models, ids).tokens) for ids in encode(prompts)[:4]]


def test_ar_matches_transformers_generate(pair, plain):
    hf = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    for ids, tokens in plain:
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(ids):].tolist()
        assert tokens == ref


@pytest.mark.parametrize("block", range(2, 17))
def test_dflash_with_trained_layout_draft_is_lossless(models, plain, block):
    for ids, tokens in plain:
        assert dflash(models, ids, block).tokens == tokens


class OracleDraft:
    """Proposes the target's true continuation, wrong with probability `p`: exercises every acceptance length.

    It also records the context positions it was fed, to check each tap arrives exactly once.
    """

    def __init__(self, truth: list[int], p: float, seed: int = 0, vocab: int = 2048):
        self.truth, self.p, self.vocab, self.fed = truth, p, vocab, []
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, tokens, hidden, input_pos):
        assert hidden.shape[1] == len(input_pos)
        self.fed += input_pos.tolist()
        first = int(input_pos[-1]) + 2  # block is at input_pos[-1]+1 ...; proposals predict the next ones
        logits = torch.zeros(1, tokens.shape[1] - 1, self.vocab)
        for j in range(tokens.shape[1] - 1):
            want = self.truth[first + j] if first + j < len(self.truth) else 0
            if torch.rand(1, generator=self.g).item() < self.p:
                want = (want + 1) % self.vocab
            logits[0, j, want] = 1.0
        return logits


@pytest.mark.parametrize("block, p", [(2, 0.0), (5, 0.1), (16, 0.05), (16, 0.0), (7, 0.5)])
def test_dflash_accepts_good_proposals_and_stays_lossless(models, prompts, block, p):
    for i, ids in enumerate(encode(prompts)[:4]):
        ref = ar(models, ids, n=40).tokens
        draft = OracleDraft(ids + ref, p, seed=i)
        out = dflash(models, ids, block, n=40, draft=draft)
        assert out.tokens == ref
        assert sum(r.emitted for r in out.rounds) + 1 == len(out.tokens)
        assert all(r.emitted == r.accepted + 1 for r in out.rounds[:-1])
        assert draft.fed == list(range(len(draft.fed))), "each context position is fed to the draft exactly once"
        if p == 0.0:  # perfect proposals: every round accepts its whole (possibly clamped) block
            assert all(r.accepted == r.verified == r.drafted == block - 1 for r in out.rounds[:-1])
            assert out.rounds[-1].accepted == out.rounds[-1].verified


def test_eos_stops_and_nothing_after_it(models, prompts):
    ids = encode(prompts)[0]
    ref = ar(models, ids, n=40).tokens
    eos = {ref[13]}
    expected = ref[:ref.index(ref[13]) + 1]
    assert ar(models, ids, n=40, eos=eos).tokens == expected
    for block in (4, 16):
        assert dflash(models, ids, block, n=40, eos=eos, draft=OracleDraft(ids + ref, 0.0)).tokens == expected
        assert dflash(models, ids, block, n=40, eos=eos).tokens == expected


def test_first_token_eos(models, prompts):
    ids = encode(prompts)[1]
    first = ar(models, ids, n=1).tokens[0]
    assert dflash(models, ids, 16, n=40, eos={first}).tokens == [first]


@pytest.mark.parametrize("n", [1, 2, 3, 17])
def test_block_clamped_to_token_budget(models, prompts, n):
    ids = encode(prompts)[2]
    ref = ar(models, ids, n=n).tokens
    assert len(ref) == n
    assert dflash(models, ids, 16, n=n, draft=OracleDraft(ids + ar(models, ids, n=40).tokens, 0.0)).tokens == ref
    assert dflash(models, ids, 16, n=n).tokens == ref


@pytest.mark.parametrize("room", [0, 1, 2, 5, 16])
def test_never_writes_past_max_seq_len(models, prompts, room):
    """The target raises if a call writes past max_seq_len, so finishing at all proves the clamp."""
    ids = encode(prompts)[3]
    limit = len(ids) + room
    ref = ar(models, ids, n=100, max_seq_len=limit).tokens
    assert len(ref) == room + 1  # the last token sits at position max_seq_len and is never written
    full = ar(models, ids, n=100).tokens
    oracle = OracleDraft(ids + full, 0.0)
    assert dflash(models, ids, 16, n=100, max_seq_len=limit, draft=oracle).tokens == ref
    assert dflash(models, ids, 16, n=100, max_seq_len=limit).tokens == ref


def test_errors(models):
    with pytest.raises(ValueError, match="the prompt has 300 tokens but max_seq_len is 256"):
        dflash(models, [1] * 300, 16)
    with pytest.raises(ValueError, match="the prompt has 300 tokens"):
        ar(models, [1] * 300)
    with pytest.raises(ValueError, match="block_size must be at least 2"):
        dflash(models, [1, 2], 1)
    with pytest.raises(ValueError, match="prompt is empty"):
        dflash(models, [], 4)
