"""validate's independent oracle: transformers' model of the checkpoint, over the call plan and greedy decoding."""

import torch

from dflash_et.checkpoints.load import eos_ids, load_target
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import builtin_prompts
from dflash_et.evaluate import transformers_oracle as oracle
from dflash_et.evaluate.validate import call_plan
from dflash_et.runtime.generate import generate_ar


def test_the_target_model_is_transformers_model_through_verify_and_rollback(trained_pair):
    target_dir, layers = trained_pair[0], [1, 3]
    ours, reference = load_target(target_dir, layers, 256), oracle.load_reference(target_dir)
    ids = encode_chat(tokenizer(target_dir), builtin_prompts(1)[0]["prompt"])
    plan = call_plan(ids, 16, 8, 256)
    assert len(plan) > 3 and plan[-1][1] < plan[-2][1] + len(plan[-2][0])  # ends with a rollback into a verify
    with torch.no_grad():
        logits_err, taps_err = oracle.compare_calls(ours, reference, plan, layers)
    assert logits_err < 1e-4 and taps_err < 1e-4
    with torch.no_grad():
        ours.layers[2].mlp.down_proj.weight.mul_(1.01)  # a 1% error in one layer
        logits_err, taps_err = oracle.compare_calls(ours, reference, plan, layers)
    assert logits_err > 1e-3 and taps_err > 1e-3


def test_greedy_decoding_is_transformers_greedy_decoding(trained_pair):
    target_dir = trained_pair[0]
    ours, reference = load_target(target_dir, [1], 256), oracle.load_reference(target_dir)
    eos = set(eos_ids(target_dir))
    ids = encode_chat(tokenizer(target_dir), builtin_prompts(2)[1]["prompt"])
    with torch.no_grad():
        tokens = generate_ar(ours, ids, 24, eos, 256, 64).tokens
    assert oracle.greedy_divergence(reference, ids, tokens, eos) is None
    wrong = tokens[:3] + [(tokens[3] + 1) % 2000] + tokens[4:]
    assert "at generated token 3" in oracle.greedy_divergence(reference, ids, wrong, eos)
