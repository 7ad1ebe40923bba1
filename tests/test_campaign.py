"""A training campaign on the CPU: sequences attended one at a time, a training head over the emitted tokens,
block tau in one batched pass, the warm start, bf16 where the CPU has it, and runs that resume exactly."""

import copy
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from dflash_et.checkpoints import zlab
from dflash_et.checkpoints.pair import load_pair
from dflash_et.files import write_json
from dflash_et.models.draft import reduce_head
from dflash_et.training import collect
from dflash_et.training import config as training_config
from dflash_et.training import state
from dflash_et.training.blocks import block_tau, draft_loss, head_labels, pack
from dflash_et.training.config import TrainConfig, check_settings, compute_dtype
from dflash_et.training.data import Sequence
from dflash_et.training.fit import Clock, Loop, fit
from dflash_et.training.train import new_draft

BLOCK = 6


@pytest.fixture(scope="module")
def setup(pair):
    target, _, _ = load_pair(*pair, max_seq_len=128)
    config = TrainConfig(num_layers=2, block_size=BLOCK, max_seq_len=128, batch=2, anchors=4)
    cfg, draft = new_draft(pair[0], target, config)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for length, prompt_len in ((40, 10), (25, 6), (33, 12)):
        tokens = torch.randint(0, target.args.vocab_size, (length,), generator=g)
        with torch.no_grad():
            _, taps = target(tokens[None], torch.arange(length))
        seqs.append(Sequence(tokens, taps[0, :-1], prompt_len))
    return target, draft, cfg["dflash_config"]["mask_token_id"], seqs, config


def test_attending_each_sequence_alone_is_the_dense_masked_call(setup):
    """`Batch.segments`: the loss and every gradient equal those of the one dense masked attention."""
    _, draft, mask_id, seqs, _ = setup
    batch = pack(seqs, [torch.tensor([10, 20, 35]), torch.tensor([6, 15]), torch.tensor([12, 30])], BLOCK, mask_id, 7.0)
    assert batch.segments == ((0, 3 * BLOCK, 0, 35), (3 * BLOCK, 5 * BLOCK, 35, 50), (5 * BLOCK, 7 * BLOCK, 50, 80))
    params = [p for p in draft.parameters() if p.requires_grad]
    results = []
    for segments in (batch.segments, None):
        loss = draft_loss(draft)(replace(batch, segments=segments))
        results.append((loss.detach(), torch.autograd.grad(loss, params)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    for ours, dense in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(ours, dense, rtol=1e-4, atol=1e-6)


def test_a_reduced_training_head_scores_its_tokens_and_drops_the_rest(setup):
    """train_draft.head_vocab: labels become rows of the kept set; a label outside it carries no loss, and the loss
    over the kept labels is the cross-entropy over the kept tokens' logits alone."""
    target, draft, mask_id, seqs, _ = setup
    reduced = copy.deepcopy(draft)
    kept = sorted(set(seqs[0].tokens[10:25].tolist()) | {0, 1, 2})
    reduce_head(reduced, kept)
    labels = torch.tensor([-100, kept[1], kept[-1], next(t for t in range(500) if t not in kept)])
    assert head_labels(reduced, labels).tolist() == [-100, 1, len(kept) - 1, -100]
    assert head_labels(draft, labels).equal(labels)
    batch = pack(seqs[:1], [torch.tensor([12, 30])], BLOCK, mask_id, 7.0)
    with torch.no_grad():
        loss = draft_loss(reduced)(batch)
        _, full = draft.packed(batch.tokens, batch.hidden, batch.ctx_pos, batch.block_pos, batch.mask, batch.rows)
        rows = head_labels(reduced, batch.labels[batch.rows])
        inside = rows >= 0
        expected = torch.nn.functional.cross_entropy(full[0][:, kept][inside], rows[inside], reduction="none")
        weights = batch.weights[batch.rows][inside]
    torch.testing.assert_close(loss, (expected * weights).sum() / weights.sum())


def test_block_tau_is_the_accepted_run_of_each_anchors_cached_draft_call(setup):
    """block_tau: 1 + the leading proposals (argmax of the inference call with the context before the anchor)
    that match the sequence, averaged over every anchor from the prompt's last token on."""
    _, draft, mask_id, seqs, _ = setup
    runs = []
    with torch.no_grad():
        for seq in seqs:
            for a in range(seq.prompt_len - 1, len(seq.tokens) - 1):
                block = torch.tensor([[int(seq.tokens[a])] + [mask_id] * (BLOCK - 1)])
                proposed = draft(block, seq.taps[None, :a], torch.arange(a))[0].argmax(-1).tolist()
                truth = seq.tokens[a + 1:a + BLOCK].tolist()
                run = 0
                while run < len(truth) and proposed[run] == truth[run]:
                    run += 1
                runs.append(1 + run)
    assert block_tau(draft, seqs, BLOCK, mask_id) == pytest.approx(sum(runs) / len(runs))


def test_the_warm_start_copies_the_targets_last_layers(pair):
    target, _, _ = load_pair(*pair, max_seq_len=128)
    _, draft = new_draft(pair[0], target, TrainConfig(num_layers=2, max_seq_len=128, warm_start=True))
    copied = 0
    for ours, theirs in zip(draft.layers, target.layers[-2:]):
        given = dict(theirs.named_parameters())
        for name, p in ours.named_parameters():
            if name in given and given[name].shape == p.shape:
                assert p.equal(given[name]) and p.data_ptr() != given[name].data_ptr()
                copied += 1
    assert copied >= 9  # q, k, v, o, gate, up, down and both norms, each layer
    _, cold = new_draft(pair[0], target, TrainConfig(num_layers=2, max_seq_len=128))
    assert not cold.layers[0].mlp.up_proj.weight.equal(draft.layers[0].mlp.up_proj.weight)


def test_bf16_where_the_cpu_has_it_and_fp32_elsewhere(monkeypatch):
    cpu = torch.device("cpu")
    for amx, avx512_bf16, expected in ((False, False, torch.float32), (True, False, torch.bfloat16),
                                       (False, True, torch.bfloat16)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda b=avx512_bf16: b)
        assert compute_dtype(TrainConfig(precision="auto"), cpu) == expected
        assert compute_dtype(TrainConfig(), cpu) == torch.float32  # the pipeline's default: the same draft anywhere
        assert compute_dtype(TrainConfig(precision="fp32"), cpu) == torch.float32
        assert compute_dtype(TrainConfig(precision="bf16"), cpu) == torch.bfloat16
    assert training_config.has_fast_bf16(torch.device("cuda"))
    with pytest.raises(ValueError, match="train_draft.precision='fp16' is not one of auto, fp32, bf16"):
        compute_dtype(TrainConfig(precision="fp16"), cpu)


@pytest.mark.parametrize("share", [0.5, 0.9])
def test_the_data_take_their_share_of_the_clock(monkeypatch, share):
    """With `minutes`, the prompts the target writes stop at 2/5 of `data_share` of the clock and its replies at
    `data_share` (training takes the rest); a share outside (0, 1] is refused in one line."""
    stops = {}

    def prompt_rows(config, tok, model, log, deadline):
        stops["prompts"] = deadline
        return [{"prompt": "held out"}], [{"prompt": "asked"}], {}

    def target_replies(model, prompts, max_new, eos, batch, deadline=None, log=None):
        stops.setdefault("replies", deadline)
        return {i: [7] for i in range(len(prompts))}

    monkeypatch.setattr(collect, "prompt_rows", prompt_rows)
    monkeypatch.setattr(collect, "target_replies", target_replies)
    monkeypatch.setattr(collect, "encode_chat", lambda tok, prompt: [1, 2, 3])
    clock = Clock(10.0)
    train, heldout, _ = collect.new_data(TrainConfig(data_share=share), None, None, set(), clock, print)
    assert train == [([1, 2, 3, 7], 3)] and heldout == [([1, 2, 3, 7], 3)]
    span = clock.deadline - clock.start
    assert stops["prompts"] == pytest.approx(clock.start + 0.4 * share * span)
    assert stops["replies"] == pytest.approx(clock.start + share * span)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"train_draft.data_share={bad} must be a share of the clock"):
            check_settings(TrainConfig(data_share=bad))


class StepClock(Clock):
    """A clock that runs out after `steps` calls of `left` (one a step): a session stopped at a known step."""

    def __init__(self, steps: int):
        super().__init__(None)
        self.calls, self.steps = 0, steps

    def left(self) -> float:
        self.calls += 1
        return float("inf") if self.calls <= self.steps else float("-inf")


def test_a_resumed_run_steps_exactly_as_an_uninterrupted_one(setup, pair, tmp_path):
    """Stopped after 5 of 12 steps, saved to disk, read back into a new draft and optimizer: the 7 steps after
    give the same weights, moments and losses as 12 steps in one go."""
    target, _, mask_id, seqs, config = setup

    def fresh():
        return new_draft(pair[0], target, config)[1]

    def run(draft, clock, progress, resume=None, saves=None):
        loop = Loop(resume=resume, save=saves.append if saves is not None else None)
        return fit(draft, seqs, config, 12, mask_id, clock, 0.0, progress, loop)

    whole = state.Progress()
    uninterrupted = run(fresh(), Clock(None), whole)
    first, saved = state.Progress(), []
    tensors = run(fresh(), StepClock(5), first, saves=saved)
    assert first.step == 5 and len(first.losses) == 5
    state.save(tmp_path / "state", config, "fp", state.Saved([([1, 2, 3], 1)], [([1, 2], 1)], first, tensors))
    back = state.load(tmp_path / "state", config, "fp")
    assert back.progress == first and back.train == [([1, 2, 3], 1)] and back.heldout == [([1, 2], 1)]
    resumed = run(fresh(), StepClock(100), back.progress, resume=back.tensors, saves=[])
    assert back.progress.step == 12 and back.progress.losses == whole.losses and back.progress.rows == whole.rows
    assert resumed.keys() == uninterrupted.keys()
    for key in uninterrupted:
        assert resumed[key].equal(uninterrupted[key]), key


def test_a_campaign_keeps_the_weights_of_its_best_block_tau(setup, pair, tmp_path):
    """Checkpoints each step (save_minutes 0) measuring block tau 1.1, 1.5, 1.2: the kept `best.<name>` weights are
    step 2's, through a save and a resume whose lower taus leave them; a higher one replaces them."""
    target, _, mask_id, seqs, config = setup
    config = replace(config, save_minutes=0)
    draft = new_draft(pair[0], target, config)[1]
    snapshots = []

    def run(taus, progress, resume=None):
        told = iter(taus)
        loop = Loop(measure=lambda: next(told), resume=resume,
                    save=lambda t: snapshots.append({k: v.clone() for k, v in t.items()}))
        return fit(draft, seqs, config, 12, mask_id, StepClock(len(taus)), 0.0, progress, loop)

    progress = state.Progress()
    tensors = run([1.1, 1.5, 1.2], progress)
    assert progress.best == {"step": 2, "block_tau": 1.5} and progress.step == 3
    best = state.best_of(tensors)
    assert best and all(best[f"best.{k[6:]}"].equal(v) for k, v in snapshots[1].items() if k.startswith("draft."))
    assert not all(best[f"best.{k[6:]}"].equal(v) for k, v in snapshots[2].items() if k.startswith("draft."))
    state.save(tmp_path / "state", config, "fp", state.Saved([([1, 2, 3], 1)], [], progress, tensors))
    back = state.load(tmp_path / "state", config, "fp")
    again = run([1.3, 1.5], back.progress, resume=back.tensors)
    assert back.progress.best == {"step": 2, "block_tau": 1.5} and back.progress.step == 5
    assert all(again[k].equal(v) for k, v in best.items())
    later = run([1.6], back.progress, resume=again)
    assert back.progress.best == {"step": 6, "block_tau": 1.6}
    state.copy_into(draft, later, "best.")
    assert all(p.equal(later[f"best.{n}"]) for n, p in draft.named_parameters() if p.requires_grad)


def test_a_damaged_or_foreign_state_is_one_line_and_nothing_is_written(tmp_path):
    config = TrainConfig()
    good = tmp_path / "good"
    state.save(good, config, "fp", state.Saved([([1, 2, 3], 1)], [], state.Progress(step=3), {"x": torch.zeros(2)}))
    assert state.load(tmp_path / "new", config, "fp") is None
    (tmp_path / "empty").mkdir()
    assert state.load(tmp_path / "empty", config, "fp") is None
    cases = {
        "missing": (lambda d: (d / "state.json").unlink(),
                    "state.json is missing, so this is not a training run's state"),
        "truncated": (lambda d: (d / "state.safetensors").write_bytes(b"\x10\x00"), "its state is damaged"),
        "json": (lambda d: (d / "state.json").write_text("{"), "its state is damaged"),
    }
    for name, (damage, said) in cases.items():
        folder = tmp_path / name
        shutil.copytree(good, folder)
        damage(folder)
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        with pytest.raises(ValueError) as e:
            state.load(folder, config, "fp")
        assert said in str(e.value) and "\n" not in str(e.value)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    with pytest.raises(ValueError, match="another target"):
        state.load(good, config, "other")
    with pytest.raises(ValueError, match=r"train_draft.lr=0.001, not 0.002 \(pass --set lr=0.001 to continue it\)"):
        state.load(good, replace(config, lr=2e-3), "fp")
    assert state.load(good, replace(config, minutes=5.0, steps=9000, precision="fp32"), "fp").progress.step == 3


def test_a_clone_without_the_trainer_goes_on_from_the_campaigns_draft(tmp_path):
    """Git keeps a campaign's replies and state.json but not state.safetensors: a clone goes on from the draft the
    campaign wrote (its best weights, at their step), or, with none of this campaign's, from new weights."""
    config = TrainConfig()
    curve = [{"step": 0, "rows": 0}, {"step": 20, "rows": 600}, {"step": 30, "rows": 900}]
    progress = state.Progress(step=30, rows=900, losses=[5.0, 4.0], curve=curve, tau_untrained=1.0,
                              best={"step": 20, "block_tau": 1.3, "heldout_tau": 1.2}, counts={"set": 1})
    state.save(tmp_path / "state", config, "fp", state.Saved([([1, 2, 3], 1)], [], progress, {"x": torch.zeros(2)}))
    (tmp_path / "state" / "state.safetensors").unlink()
    fresh = state.load(tmp_path / "state", config, "fp", tmp_path / "no-draft")
    assert fresh.tensors == {} and fresh.train == [([1, 2, 3], 1)] and fresh.progress.counts == {"set": 1}
    p = fresh.progress
    assert (p.step, p.rows, p.losses, p.curve, p.best, p.tau_untrained) == (0, 0, [], [], None, None)
    draft = tmp_path / "draft"
    zlab.save_draft(draft, {}, {"fc.weight": torch.full((2, 2), 0.5, dtype=torch.bfloat16),
                                "lm_head.weight": torch.zeros(1)})
    card = {"target_checkpoint_id": "fp", "draft_step": 20, "heldout_block_tau": 1.3, "heldout_tau": 1.2,
            "config": asdict(config)}
    write_json(draft / "train_draft.json", card)
    went_on = state.load(tmp_path / "state", config, "fp", draft)
    p = went_on.progress
    assert (p.step, p.rows, p.curve, p.best) == (20, 600, curve[:2], {"step": 20, "block_tau": 1.3, "heldout_tau": 1.2})
    assert set(went_on.tensors) == {"draft.fc.weight", "best.fc.weight"}
    assert all(t.dtype == torch.float32 and bool((t == 0.5).all()) for t in went_on.tensors.values())
    for other in ({"target_checkpoint_id": "other"}, {"config": asdict(replace(config, num_layers=3))}):
        write_json(draft / "train_draft.json", card | other)
        assert state.load(tmp_path / "state", config, "fp", draft).tensors == {}
    write_json(draft / "train_draft.json", card)
    (draft / "model.safetensors").write_bytes(b"\x10\x00")  # a damaged draft is one line, not a traceback
    with pytest.raises(ValueError, match="the campaign's draft it would go on from, is damaged") as e:
        state.load(tmp_path / "state", config, "fp", draft)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_train_draft_resumes_its_campaign_from_the_folder(trained_pair, tmp_path):
    """`dflash train-draft ... --resume DIR` thrice: the second run continues at the first one's step with its
    replies, writes and answers the prompts a larger `synthetic_prompts` asks for, and its card lists both
    sessions; the third answers the set's prompts a larger `num_prompts` adds; a damaged DIR is refused in one line
    before anything is written."""
    import subprocess
    import sys

    import numpy as np

    from tests import REPO

    def train(steps: int, synthetic: int, out: Path, asked: int = 6) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dflash_et.cli", "train-draft", str(trained_pair[0]), str(out),
                               "--resume", str(tmp_path / "state"), "--set", f"steps={steps}", "--set",
                               f"synthetic_prompts={synthetic}", "--set", f"num_prompts={asked}", "--set", "heldout=2",
                               "--set", "max_new_tokens=12", "--set", "head_vocab=64", "--set", "batch=2",
                               "--set", "compute_budget=null", "--set", "generate_batch=8"],
                              cwd=REPO, capture_output=True, text=True)

    def sequences() -> int:
        with np.load(tmp_path / "state" / "replies.npz") as arrays:
            return len(arrays["train_lengths"])

    first = train(6, 4, tmp_path / "draft")
    assert first.returncode == 0, first.stderr[-2000:]
    before = json.loads((tmp_path / "draft" / "train_draft.json").read_text())["data"]["prompts"]["synthetic"]
    had = sequences()
    second = train(10, before + 4, tmp_path / "draft")
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resuming {tmp_path / 'state'} at step 6 of 10 ({had} sequences)" in second.stdout
    card = json.loads((tmp_path / "draft" / "train_draft.json").read_text())
    grown = card["data"]["prompts"]["synthetic"] - before
    assert 0 < grown <= 4 and sequences() == had + grown == card["train_sequences"]
    assert card["steps"] == 10 and [s["from_step"] for s in card["sessions"]] == [0, 6]
    assert card["head_vocab"] == 64 and card["curve"][0]["step"] == 0 and card["curve"][-1]["step"] == 10
    best = max(card["curve"][1:], key=lambda p: p["block_tau"])  # the first of the best measured after training
    assert (card["draft_step"], card["heldout_block_tau"]) == (best["step"], best["block_tau"])
    third = train(12, card["data"]["prompts"]["synthetic"], tmp_path / "draft", asked=8)
    assert third.returncode == 0, third.stderr[-2000:]
    card = json.loads((tmp_path / "draft" / "train_draft.json").read_text())
    assert sequences() == had + grown + 2 and card["data"]["prompts"]["set"] == 8
    assert "2 new prompts and replies beside the" in third.stdout
    (tmp_path / "state" / "state.safetensors").unlink()  # a clone: its draft's weights go on, at their step
    card = json.loads((tmp_path / "draft" / "train_draft.json").read_text())
    fourth = train(14, card["data"]["prompts"]["synthetic"], tmp_path / "draft", asked=8)
    assert fourth.returncode == 0, fourth.stderr[-2000:]
    assert f"resuming {tmp_path / 'state'} at step {card['draft_step']} of 14" in fourth.stdout
    assert json.loads((tmp_path / "draft" / "train_draft.json").read_text())["steps"] == 14
    (tmp_path / "state" / "state.safetensors").write_bytes(b"garbage")
    third = train(14, card["data"]["prompts"]["synthetic"], tmp_path / "draft2", asked=8)
    assert third.returncode != 0 and not (tmp_path / "draft2").exists()
    said = third.stderr.strip().splitlines()[-1]
    assert said.startswith(f"error: --resume {tmp_path / 'state'}: its state is damaged")


def test_a_campaign_taps_only_the_sequences_its_cache_lacks(trained_pair, tmp_path, monkeypatch):
    """cached_taps: a first session taps every sequence and keeps them; the next, with two more, taps only those two
    and returns what tapping all would, and one with nothing new leaves the file alone; another key (target, layers, dtype) or a damaged file taps all again."""
    from dflash_et.training import data

    target_dir, layers = trained_pair[0], [1, 3]
    model = data.reply_model(target_dir, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    seqs = [(torch.randint(0, 200, (n,), generator=g).tolist(), 3) for n in (9, 14, 6, 11, 14)]
    whole = data.tapped(model, layers, seqs)
    computed = []
    real = data.tapped

    def counting(model, layer_ids, sequences, **kw):
        computed.append(len(sequences))
        return real(model, layer_ids, sequences, **kw)
    monkeypatch.setattr(data, "tapped", counting)
    cache = tmp_path / "state.taps.safetensors"

    def taps(sequences, key="k"):
        return data.cached_taps(model, layers, sequences, cache, key)
    for got, want in zip(taps(seqs[:3]), whole):
        assert got.tokens.tolist() == want.tokens.tolist() and got.prompt_len == 3
        torch.testing.assert_close(got.taps, want.taps, rtol=1e-5, atol=1e-5)
    assert computed == [3]
    both = taps(seqs)
    assert computed == [3, 2] and [s.tokens.tolist() for s in both] == [t for t, _ in seqs]
    for got, want in zip(both, whole):
        torch.testing.assert_close(got.taps, want.taps, rtol=1e-5, atol=1e-5)
    written = cache.stat().st_mtime_ns
    taps(seqs[1:])
    assert computed == [3, 2] and cache.stat().st_mtime_ns == written  # nothing new: the file is left as it is
    taps(seqs, key="other target")
    cache.write_bytes(b"\x10\x00garbage")
    taps(seqs)
    assert computed == [3, 2, 5, 5]
