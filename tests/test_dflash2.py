"""DFlash2 drafts (models.dflash2) against z-lab's DFlash2DraftModel (`dflash` 0.1.0): the lattice, the
greedy path and the sampled path's distributions, round after round of the cached draft."""

import itertools
from collections import Counter

import pytest
import torch

from dflash_et.checkpoints.load import load_config, load_draft, load_target
from dflash_et.checkpoints.zlab import draft_settings
from dflash_et.errors import CheckpointError
from dflash_et.models.dflash2 import convolve
from dflash_et.runtime import native
from dflash_et.runtime.sampling import Lattice
from tests.tiny_checkpoints import DFLASH2, random_draft
from tests.test_generate import models, prompts  # noqa: F401  (fixtures: the built-in random pair, its prompts)


@pytest.fixture(scope="module")
def dflash2(pair, tmp_path_factory):
    """The built-in random target, a random DFlash2 draft for it, ours and z-lab's."""
    from dflash import DFlash2DraftModel

    draft_dir = random_draft(tmp_path_factory.mktemp("dflash2") / "draft", pair[0], **DFLASH2)
    settings = draft_settings(load_config(draft_dir))
    target = load_target(pair[0], settings.target_layer_ids, 128)
    return target, load_draft(draft_dir, target), DFlash2DraftModel.from_pretrained(draft_dir).eval(), settings


def walk(lattice: Lattice, temperature: float = 0.0, generator: torch.Generator | None = None
         ) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
    """The runners' walk (native.walk) as these tests read it: (path, the scores [P, k] each choice was made from,
    sampled: the distributions over the candidates drawn from [P, k]), its draws seeded from `generator`."""
    seed = int(torch.randint(0, 2**62, (), generator=generator)) if temperature > 0 else 0
    vocab = int(lattice.candidates.max()) + 1
    path, q, scores = native.walk(lattice.candidates, lattice.unary, lattice.pair, vocab, temperature, temperature > 0,
                                  seed)
    return path, scores, None if q is None else q.gather(1, lattice.candidates.long())


def rounds(target, draft, zlab, settings, seed=0):
    """Each round: (our lattice, z-lab's draft hidden of the proposal rows, the block's anchor). Blocks are no
    shorter than the kernel: z-lab's convolution fails on shorter ones (ours: test_convolution_is_causal...)."""
    g = torch.Generator().manual_seed(seed)
    width = len(settings.target_layer_ids) * target.args.hidden_size
    taps = torch.empty(1, 0, width)
    for n, b in [(7, 16), (1, 4), (3, 5), (16, 9), (2, 16), (5, 4)]:
        new = torch.randn(1, n, width, generator=g)
        start = taps.shape[1]
        taps = torch.cat([taps, new], dim=1)
        anchor = int(torch.randint(0, target.args.vocab_size, (1,), generator=g))
        block = torch.tensor([[anchor] + [settings.mask_token_id] * (b - 1)])
        with torch.no_grad():
            ours = Lattice(*draft(block, new, torch.arange(start, start + n)))
            hidden = zlab(position_ids=torch.arange(taps.shape[1] + b)[None], noise_embedding=target.embed_tokens(block),
                          target_hidden=taps)[:, 1:]
        yield ours, hidden, torch.tensor([anchor])


def test_dflash2_settings_and_weights_load_as_zlab_writes_them(dflash2):
    target, draft, zlab, settings = dflash2
    assert settings.variant == "dflash2" and settings.conv == (4, 8) and settings.selector == (8, 6)
    ours = draft.state_dict()
    for name, theirs in zlab.state_dict().items():
        if name not in ("embed_tokens.weight", "lm_head.weight") and not name.startswith("rotary_emb"):
            torch.testing.assert_close(ours[name], theirs, rtol=0, atol=0)


def test_dflash2_lattice_and_greedy_path_match_zlab(dflash2):
    target, draft, zlab, settings = dflash2
    for ours, hidden, anchor in rounds(target, draft, zlab, settings):
        with torch.no_grad():
            logits = zlab.compute_logits(hidden, target.lm_head)
            path, candidates, _ = zlab.propose(hidden, anchor, target.lm_head, 0.0)
        values, ids = torch.topk(logits[0], settings.selector[1], dim=-1)
        assert torch.equal(ours.candidates, ids)
        torch.testing.assert_close(ours.unary, values, rtol=1e-4, atol=1e-4)
        assert walk(ours)[0] == path[0].tolist()


def test_dflash2_sampled_walk_draws_from_zlabs_distributions(dflash2):
    """z-lab's sampled path, step by step: our scores after the same predecessor give the same distribution over
    the same candidates (its q rows, for rejection sampling)."""
    target, draft, zlab, settings = dflash2
    torch.manual_seed(0)
    for ours, hidden, anchor in rounds(target, draft, zlab, settings, seed=1):
        with torch.no_grad():
            path, candidates, q_rows = zlab.propose(hidden, anchor, target.lm_head, 0.7)
        chosen = 0
        for p, token in enumerate(path[0].tolist()):
            q = torch.softmax((ours.unary[p] + ours.pair[p, chosen]) / 0.7, dim=-1)
            theirs = dict(zip(candidates[0, p].tolist(), q_rows[0, p].tolist()))
            assert dict(zip(ours.candidates[p].tolist(), q.tolist())) == pytest.approx(theirs, abs=1e-5)
            chosen = ours.candidates[p].tolist().index(token)


def test_a_dflash2_draft_says_so_in_its_architectures(pair, tmp_path):
    import json

    from dflash_et.checkpoints.check import check_pair

    draft_dir = random_draft(tmp_path / "draft", pair[0], **DFLASH2)
    check_pair(pair[0], draft_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    (draft_dir / "config.json").write_text(json.dumps(config | {"architectures": ["DFlashDraftModel"]}))
    with pytest.raises(CheckpointError, match=r"architectures is not \['DFlash2DraftModel'\] \(the config has DFlash2's"):
        check_pair(pair[0], draft_dir)


def test_walk_greedy_and_sampled_on_a_known_lattice():
    lattice = Lattice(torch.tensor([[5, 7], [1, 2], [3, 4]]), torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]),
                      torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [0.0, 2.0]], [[0.0, 9.0], [1.0, 0.0]]]))
    assert walk(lattice)[0] == [7, 2, 3]  # after 7 (index 1): 2 scores 2, then after 2 (index 1): 3 scores 1
    assert walk(lattice)[1].tolist() == [[0.0, 1.0], [0.0, 2.0], [1.0, 0.0]]  # the scores each choice saw
    path, scores, q = walk(lattice, 1.0, torch.Generator().manual_seed(0))
    assert q.shape == (3, 2) and torch.allclose(q.sum(-1), torch.ones(3))
    torch.testing.assert_close(q, torch.softmax(scores, -1))
    torch.testing.assert_close(q[0], torch.softmax(torch.tensor([0.0, 1.0]), -1))


def test_convolution_is_causal_within_each_block():
    """A change to a row moves no earlier row of its block and no row of another block (training's packed blocks)."""
    g = torch.Generator().manual_seed(0)
    x, dynamic, base = torch.randn(1, 8, 16, generator=g), torch.randn(1, 8, 3, 2, generator=g), torch.randn(3, 16, generator=g)
    blocks = torch.arange(8) // 4
    rows_see = blocks[:, None] == blocks[None, :]
    out = convolve(x, dynamic, base, 8, rows_see)
    moved = x.clone()
    moved[0, 2] += 1
    diff = (convolve(moved, dynamic, base, 8, rows_see) - out).abs().sum(-1)[0]
    assert diff[:2].max() == 0 and diff[4:].max() == 0 and diff[2:4].min() > 0
    for rows in (4, 2):  # a block alone, and one shorter than the kernel: the first rows of a longer one
        torch.testing.assert_close(convolve(x[:, :rows], dynamic[:, :rows], base, 8, None), out[:, :rows])


def test_a_dflash2_config_missing_a_key_is_refused(pair, tmp_path):
    import json

    draft_dir = random_draft(tmp_path / "draft", pair[0])
    config = json.loads((draft_dir / "config.json").read_text())
    config["dflash_config"] |= dict(conv_kernel_size=4, conv_group_size=8, selector_rank=8)
    (draft_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="a DFlash2 draft needs conv_kernel_size, conv_group_size, "
                                              "selector_rank, selector_top_k as positive integers"):
        draft_settings(load_config(draft_dir))


def toy_lattice(seed: int, target, temperature: float) -> tuple[Lattice, dict]:
    """A lattice over test_sampling's toy vocabulary (3 of its 5 tokens per position, near the target's greedy
    path), and the exact law of a sampled walk through it: path -> (probability, q [N, V] after each prefix)."""
    from tests.test_sampling import N, V

    g = torch.Generator().manual_seed(seed)
    candidates = torch.stack([torch.randperm(V, generator=g)[:3] for _ in range(N)])
    unary = torch.stack([target(())[c] for c in candidates]) + torch.randn(N, 3, generator=g)
    lattice = Lattice(candidates, unary, torch.randn(N, 3, 3, generator=g))
    law = {}
    for choice in itertools.product(range(3), repeat=N):
        prob, q, before = 1.0, torch.zeros(N, V), 0
        for p, c in enumerate(choice):
            row = torch.softmax((lattice.unary[p] + lattice.pair[p, before]) / temperature, -1)
            q[p, candidates[p]] = row
            prob, before = prob * float(row[c]), c
        law[tuple(int(candidates[p, c]) for p, c in enumerate(choice))] = (prob, q)
    return lattice, law


@pytest.mark.parametrize("proposals", ["argmax", "sample"])
def test_dflash2_rounds_have_exactly_the_target_distribution(proposals):
    """A round from a DFlash2 walk (each position's q depends on the proposal before it), by enumeration, is the
    target's own distribution; and the Sampler's walk and verify, run 20000 times, follow that enumeration."""
    from dflash_et.evaluate.same_distribution import chi_square, total_variation
    from dflash_et.runtime.sampling import Sampler, Sampling, acceptance, distribution, residual
    from tests.test_sampling import V, max_error_against_target, toy_target

    s = Sampling(0.9, top_k=4, proposals=proposals, seed=1)
    target = toy_target(3)
    lattice, law = toy_lattice(3, target, s.temperature)
    if proposals == "argmax":
        law = {tuple(walk(lattice)[0]): (1.0, None)}
    exact = Counter()
    for xs, (weight, q) in law.items():
        reach = weight
        for i, x in enumerate(xs):
            p = distribution(target(xs[:i]), s)
            q_i = None if q is None else q[i]
            a, rejected = acceptance(p, q_i, x), residual(p, q_i, x)
            for y in range(V):
                exact[xs[:i] + (y,)] += reach * (1 - a) * float(rejected[y])
            reach *= a
        for y in range(V):
            exact[xs + (y,)] += reach * float(distribution(target(xs), s)[y])
    assert abs(sum(exact.values()) - 1) < 1e-6 and max_error_against_target(target, exact, s) < 1e-6
    sampler, seen = Sampler(s), Counter()
    for _ in range(20000):
        xs, q, _ = sampler.walk(lattice, V)
        accepted, following = sampler.verify(xs, q, torch.stack([target(tuple(xs[:i])) for i in range(len(xs) + 1)]))
        seen[tuple(xs[:accepted]) + (following,)] += 1
    expected = Counter({k: round(v * 1e6) for k, v in exact.items() if v > 0})
    _, _, p = chi_square(seen, expected)
    assert set(seen) <= set(expected) and p > 1e-3 and total_variation(seen, expected) < 0.02


class OracleLattice:
    """test_generate's OracleDraft as a DFlash2 draft: each position's candidates are the oracle's token (mostly
    the target's continuation) and two others, the pairwise scores small noise: the path follows the oracle."""

    returns_lattice = True

    def __init__(self, oracle):
        self.oracle, self.g = oracle, torch.Generator().manual_seed(5)

    def __call__(self, tokens, hidden, input_pos):
        want = self.oracle(tokens, hidden, input_pos)[0].argmax(-1)
        candidates = torch.stack([want, (want + 1) % self.oracle.vocab, (want + 2) % self.oracle.vocab], dim=1)
        unary = torch.tensor([[1.0, 0.0, 0.0]]).expand(len(want), 3)
        return candidates, unary, 0.4 * torch.rand(len(want), 3, 3, generator=self.g)


@pytest.mark.parametrize("block, p", [(2, 0.0), (5, 0.1), (16, 0.0), (7, 0.5)])
def test_greedy_dflash2_decoding_is_the_targets_greedy_decoding(models, prompts, block, p):
    from tests.test_generate import OracleDraft, ar, dflash, encode

    for i, ids in enumerate(encode(prompts)[:3]):
        ref = ar(models, ids, n=40).tokens
        out = dflash(models, ids, block, n=40, draft=OracleLattice(OracleDraft(ids + ref, p, seed=i)))
        assert out.tokens == ref
        if p == 0.0:
            assert all(r.accepted == r.verified == block - 1 for r in out.rounds[:-1])


def test_a_random_dflash2_draft_decodes_losslessly(dflash2, prompts):
    from dflash_et.runtime.generate import generate_ar, generate_dflash
    from tests.test_generate import encode

    target, draft, _, settings = dflash2
    for ids in encode(prompts)[:3]:
        ref = generate_ar(target, ids, 24, set(), 128, 16).tokens
        for block in (2, 4, 16):
            assert generate_dflash(target, draft, ids, 24, set(), 128, 16, block, settings.mask_token_id).tokens == ref



@pytest.fixture(scope="module")
def dflash2_programs(programs, trained_pair, tmp_path_factory):
    """The trained target's programs with a random DFlash2 draft.pte beside them (fp32 XNNPACK)."""
    import shutil

    from dflash_et.export.config import ExportConfig
    from dflash_et.export.lower import export_program
    from tests.tiny_programs import MAX_SEQ_LEN, PREFILL_CHUNK

    out = tmp_path_factory.mktemp("dflash2-programs")
    shutil.copytree(programs, out / "programs")
    taps = draft_settings(load_config(trained_pair[1])).target_layer_ids  # the layers target.pte returns
    draft_dir = random_draft(out / "draft", trained_pair[0], **DFLASH2, target_layer_ids=taps)
    export_program("draft", trained_pair[0], draft_dir, ExportConfig(max_seq_len=MAX_SEQ_LEN, prefill_chunk=PREFILL_CHUNK),
                   out / "programs")
    return out / "programs", draft_dir


def test_dflash2_draft_program_matches_the_eager_draft_and_decodes_losslessly(dflash2_programs, trained_pair):
    """draft.pte computes the convolutions and the lattice as the eager draft does (validate's calls, lattice
    scores and candidates), says it is DFlash2, and DFlash through the programs is plain greedy decoding."""
    from dflash_et.runtime.engine import Engine
    from tests.tiny_programs import numerics

    programs_dir, draft_dir = dflash2_programs
    checked, (_, draft_p), _ = numerics(programs_dir, (trained_pair[0], draft_dir))
    assert draft_p.meta.selector_top_k == DFLASH2["selector_top_k"]
    assert checked["worst"]["draft_rel"].value < 1e-4
    engine = Engine(programs_dir)
    for prompt in ([5, 9, 14, 3, 22, 7], list(range(3, 40))):
        reference = engine.ar(prompt, 30).tokens
        for block in (2, 5, engine.max_block_size):
            assert engine.dflash(prompt, 30, block).tokens == reference


def test_the_cpp_runner_walks_a_dflash2_draft_as_the_python_engine_does(dflash2_programs, runner):
    """A random DFlash2 draft (pairwise scores as large as its logits) through the C++ runner: the Python engine's
    tokens and rounds (tests/test_runner.py holds a trained one to plain greedy decoding and to the target's
    distribution)."""
    from dflash_et.runtime.cpp_runner import CppEngine
    from dflash_et.runtime.engine import Engine

    engine = Engine(dflash2_programs[0])
    with CppEngine(dflash2_programs[0], runner, threads=1) as cpp:
        for prompt in ([5, 9, 14, 3, 22, 7], list(range(3, 40))):
            for block in (2, 5, engine.max_block_size):
                ours, theirs = (e.dflash(prompt, 30, block) for e in (cpp, engine))
                assert ours.tokens == theirs.tokens
                assert [(r.verified, r.accepted) for r in ours.rounds] == [(r.verified, r.accepted)
                                                                           for r in theirs.rounds]


@pytest.mark.slow  # lowers programs
def test_a_dflash2_draft_lowers_to_mlx_4w_in_one_delegate(pair, tmp_path):
    """MLX's 4w recipe quantizes Linears and embeddings in groups of 32: the selector's rank-8 codebooks are
    narrower and stay as they are; the convolutions and the lattice lower with the rest (top-k beside it)."""
    from dflash_et.export.config import ExportConfig
    from dflash_et.export.lower import export_program

    draft_dir = random_draft(tmp_path / "draft", pair[0], **DFLASH2)
    config = ExportConfig.from_params({"max_seq_len": 64, "prefill_chunk": 16, "backend": "mlx", "dtype": "bf16",
                                       "quantize": "4w"})
    summary = export_program("draft", pair[0], draft_dir, config, tmp_path / "out")
    assert summary["ops"]["delegate_calls"] == 1 and summary["ops"]["portable"] <= 3
    assert summary["metadata"]["get_selector_top_k"] == DFLASH2["selector_top_k"]


def test_a_new_dflash2_draft_starts_as_its_dflash_draft(pair, tmp_path):
    """init_draft_weights' DFlash2 parts start as the identity (convolutions) and as nothing (selector): the same
    logits as the DFlash draft of the same seed, and its greedy path is their argmax."""
    import json

    from dflash_et.checkpoints import zlab

    target = load_target(pair[0], [1], 64)
    base = zlab.draft_config(json.loads((pair[0] / "config.json").read_text()), 4, 2, 8)
    two = json.loads(json.dumps(base))
    two["dflash_config"] |= DFLASH2
    two["architectures"] = [zlab.ARCHITECTURES["dflash2"]]
    drafts = []
    for name, config in (("one", base), ("two", two)):
        zlab.save_draft(tmp_path / name, config, zlab.init_draft_weights(config, seed=0))
        drafts.append(load_draft(tmp_path / name, target))
    width = len(base["dflash_config"]["target_layer_ids"]) * target.args.hidden_size
    block, taps = torch.tensor([[7] + [4] * 7]), torch.randn(1, 5, width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = drafts[0](block, taps, torch.arange(5))[0]
        lattice = Lattice(*drafts[1](block, taps, torch.arange(5)))
    assert lattice.pair.abs().max() == 0
    torch.testing.assert_close(lattice.unary, torch.topk(logits, DFLASH2["selector_top_k"], dim=-1).values)
    assert walk(lattice)[0] == logits.argmax(-1).tolist()


def test_training_rows_are_scored_after_their_true_predecessor_and_the_loss_adds_the_selectors(pair):
    """pack's `before`: the anchor for the first proposal row, then the target's own tokens; draft_loss adds the
    selector's cross-entropy over each row's candidates (rows whose label is not a candidate add nothing)."""
    import torch.nn.functional as F

    from dflash_et.training.blocks import draft_loss, pack
    from dflash_et.training.data import Sequence
    from dflash_et.training.train import TrainConfig, new_draft

    target = load_target(pair[0], [1], 128)
    _, draft = new_draft(pair[0], target, TrainConfig(num_layers=1, block_size=6, max_seq_len=128, variant="dflash2"))
    assert draft.candidate_selector.top_k == 16 and draft.layers[0].attention_conv.kernel_size == 2
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.args.vocab_size, (30,), generator=g)
    with torch.no_grad():
        taps = target(tokens[None], torch.arange(30))[1][0]
        for p in draft.candidate_selector.parameters():  # a selector that scores: not the zero start
            p.copy_(torch.randn(p.shape, generator=g))
    draft.candidate_selector.top_k = 300  # of 2048: an untrained draft's candidates hold some labels, not all
    anchors = torch.tensor([4, 11, 26])
    batch = pack([Sequence(tokens, taps, 3)], [anchors], 6, 4, gamma=7.0)
    for r, a in enumerate(anchors.tolist()):
        for j in range(1, 6):
            if a + j < 30:
                assert batch.before[r * 6 + j] == tokens[a + j - 1]
    rows = batch.weights.nonzero().squeeze(1)
    with torch.no_grad():
        hidden, logits = draft.packed(batch.tokens, batch.hidden, batch.ctx_pos, batch.block_pos, batch.mask, rows)
        candidates, scores = draft.candidate_selector.teacher_forced(hidden[0], logits[0], batch.before[rows])
        labels, weights = batch.labels[rows], batch.weights[rows]
        token = (F.cross_entropy(logits[0], labels, reduction="none") * weights).sum()
        selector = sum(float(w) * -float(torch.log_softmax(s, -1)[c.tolist().index(int(y))])
                       for s, c, y, w in zip(scores, candidates, labels, weights) if int(y) in c.tolist())
        hits = sum(int(y) in c.tolist() for c, y in zip(candidates, labels))
        assert 0 < hits < len(labels) and selector > 0
        torch.testing.assert_close(draft_loss(draft)(batch), (token + selector) / weights.sum())


def test_a_trained_dflash2_draft_accepts_more_and_is_saved_in_zlabs_layout(trained_pair, tmp_path):
    import json
    from functools import partial

    from dflash import DFlash2DraftModel

    from dflash_et.checkpoints.check import check_pair
    from dflash_et.checkpoints.fetch import fetch
    from dflash_et.training.train import TrainConfig, train_draft

    config = TrainConfig(steps=80, num_prompts=12, heldout=3, max_new_tokens=24, block_size=8, anchors=8, batch=4,
                         max_seq_len=256, lr=2e-3, variant="dflash2")
    fetch("draft", "train", tmp_path / "draft", target_dir=trained_pair[0], train=partial(train_draft, config=config))
    report = json.loads((tmp_path / "draft" / "train_draft.json").read_text())
    assert report["heldout_tau"] > report["heldout_tau_untrained"] + 0.5, report
    saved = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert saved["architectures"] == ["DFlash2DraftModel"] and saved["dflash_config"]["selector_top_k"] == 16
    check_pair(trained_pair[0], tmp_path / "draft")
    zlab = DFlash2DraftModel.from_pretrained(tmp_path / "draft")  # z-lab's names: its loader finds every weight
    assert zlab.candidate_selector.successor_codebook.weight.abs().max() > 0  # the selector learned


def test_bad_dflash2_settings_are_one_line_errors(pair, monkeypatch):
    from dflash_et.models.dflash2 import GroupedCausalConv
    from dflash_et.training import train
    from dflash_et.training.train import TrainConfig, new_draft

    target = load_target(pair[0], [1], 64)
    with pytest.raises(ValueError, match=r"^train_draft.variant='dflash3' is not one of dflash, dflash2$"):
        new_draft(pair[0], target, TrainConfig(num_layers=1, max_seq_len=64, variant="dflash3"))
    with pytest.raises(ValueError, match=r"^conv_group_size 48 does not divide the draft's hidden size 256$"):
        GroupedCausalConv(256, 2, 48)
    monkeypatch.setitem(train.DFLASH2, "conv_group_size", 48)
    with pytest.raises(ValueError, match=r"^train_draft.variant=dflash2 convolves groups of 48 channels, which do not "
                                         r"divide the target's hidden size 256; use dflash$"):
        new_draft(pair[0], target, TrainConfig(num_layers=1, max_seq_len=64, variant="dflash2"))


# ------------------------------------------------------- validate's sampled check through DFlash2 programs

CHECK = dict(samples=400, prompts=3)  # validate.sampling for the DFlash2 checks below: 400 completions of 6 tokens


@pytest.fixture(scope="module")
def trained_dflash2_loaded(trained_dflash2_programs):
    from tests.test_sampled_programs import load

    return load(trained_dflash2_programs)


def test_sampled_dflash2_through_the_programs_has_the_targets_distribution(trained_dflash2_loaded, monkeypatch):
    """validate's sampling check (same_distribution.check_sampling) through a DFlash2 draft.pte, both proposal modes:
    every round's proposals are the lattice's walk (greedy with argmax proposals, q one-hot; drawn with sampled
    ones, q its distributions), its pairwise scores move greedy walks off the top logits, the target accepts
    proposals, and the tokens have target.pte's distribution (3 prompts x 2 modes x 6 tokens: 36 chi-square
    tests). The next test shows the same check catching a walk whose q is not what it drew from."""
    from dflash_et.runtime.sampling import Sampler
    from tests.test_sampled_programs import check

    walked, moved, right = Counter(), Counter(), Sampler.walk

    def spy(self, lattice, vocab_size):
        path, q, scores = right(self, lattice, vocab_size)
        walked[self.sampling.proposals, q is None] += 1
        moved[self.sampling.proposals] += path != lattice.candidates[:, 0].tolist()
        return path, q, scores

    monkeypatch.setattr(Sampler, "walk", spy)
    report = check(trained_dflash2_loaded, **CHECK)
    assert report["same_distribution"] and report["tests"] == 36, report
    completions = CHECK["samples"] * CHECK["prompts"]
    assert walked.keys() == {("argmax", True), ("sample", False)} and min(walked.values()) >= completions, walked
    assert moved["argmax"] > 0.1 * walked["argmax", True], moved  # the pairwise scores choose paths
    assert min(report["tau"].values()) > 1.5, report["tau"]  # proposals accepted: the rule saw q


def test_validate_passes_on_dflash2_programs(trained_dflash2_programs, trained_pair):
    """Every check of the validate stage through a DFlash2 draft.pte: its lattice against the eager draft's, greedy
    DFlash at blocks 2, the largest and auto against plain greedy decoding, the sampling check (test size), with
    proposals accepted in both modes."""
    from dflash_et.evaluate.validate import validate
    from tests.tiny_programs import validate_config

    report = validate(trained_dflash2_programs, trained_pair[0], trained_dflash2_programs.parent / "draft",
                      validate_config(prompts=2, max_new_tokens=12))
    assert report["failures"] == [] and report["lossless"] and report["sampling"]["same_distribution"], report
    assert min(report["sampling"]["tau"].values()) > 1.5, report["sampling"]


def on_vocabulary(lattice: Lattice, rows: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Distributions over each position's candidates [P, k] as q [P, V] (as Sampler.walk puts them)."""
    return torch.zeros(len(rows), vocab_size).scatter_(1, lattice.candidates, rows)


def drawn_hotter(self, lattice: Lattice, vocab_size: int):
    """Sampled proposals drawn at 4 x the sampling temperature, q said at the sampling temperature."""
    path, scores, _ = walk(lattice, 4 * self.sampling.temperature, self.generator)
    return path, on_vocabulary(lattice, torch.softmax(scores / self.sampling.temperature, -1), vocab_size), scores


def q_without_the_pair_term(self, lattice: Lattice, vocab_size: int):
    """Sampled proposals drawn right, q from the candidates' logits alone (the walk's pairwise scores dropped)."""
    path, scores, _ = walk(lattice, self.sampling.temperature, self.generator)
    q = torch.softmax(lattice.unary / self.sampling.temperature, -1)
    return path, on_vocabulary(lattice, q, vocab_size), scores


def greedy_path_sampled_q(self, lattice: Lattice, vocab_size: int):
    """Argmax proposals (the greedy walk) with the q a sampled walk would have had, not one-hot."""
    path, scores, _ = walk(lattice)
    return path, on_vocabulary(lattice, torch.softmax(scores / self.sampling.temperature, -1), vocab_size), scores


WRONG_WALKS = {"q-at-the-temperature-drawn-at-4x": ("sample", drawn_hotter),
               "q-without-the-pair-term": ("sample", q_without_the_pair_term),
               "greedy-path-with-a-sampled-q": ("argmax", greedy_path_sampled_q)}


@pytest.mark.parametrize("wrong", WRONG_WALKS)
def test_the_sampling_check_catches_a_dflash2_walk_whose_q_is_wrong(trained_dflash2_loaded, monkeypatch, wrong):
    """Sampler.walk replaced by one whose q is not the distribution its proposals were drawn from, in the proposal
    mode it runs in (the check runs that mode alone): with the samples the test above takes, the check fails."""
    from dflash_et.evaluate import same_distribution
    from dflash_et.runtime.sampling import Sampler
    from tests.test_sampled_programs import check

    proposals, wrong_walk = WRONG_WALKS[wrong]
    monkeypatch.setattr(Sampler, "walk", wrong_walk)
    monkeypatch.setattr(same_distribution, "PROPOSALS", (proposals,))
    report = check(trained_dflash2_loaded, **CHECK)
    assert report["tests"] == 18 and not report["same_distribution"], report
