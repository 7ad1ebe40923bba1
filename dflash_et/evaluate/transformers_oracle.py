"""target.pte against transformers' own model of the same checkpoint: an oracle the project did not write.

validate's other checks compare each program with the project's eager model, which is the very code
that was exported; a mistake in that model (a wrong RoPE, a GGUF tensor read transposed) would pass
them all. transformers' `AutoModelForCausalLM` is an independent implementation, so the target
program's logits and taps are compared with it over validate's call plan (prefill, decode, verify,
rollback), and plain greedy decoding of target.pte with transformers' greedy `generate`.
"""

import torch

from dflash_et.runtime.generate import TargetFn

TIE = 1e-4  # a greedy divergence where transformers' top two logits are this close (relative) is a tie


def load_reference(target_dir) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


def _forward(model: torch.nn.Module, ids: list[int], layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, V], taps [T, k*H]) of the whole sequence: HF hidden_states[i + 1] is layer i's output."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1)


def compare_calls(target: TargetFn, model: torch.nn.Module, plan: list[tuple[list[int], int]],
                  layer_ids: list[int]) -> tuple[float, float]:
    """Worst relative error of the program's logits and taps over `plan`'s calls, against the model run on
    the sequence the program's cache holds at each call (a rollback call overwrites from its start)."""
    sequence: list[int] = []
    worst_logits = worst_taps = 0.0
    for tokens, start in plan:
        sequence = sequence[:start] + tokens
        logits, taps = target(torch.tensor([tokens]), torch.arange(start, start + len(tokens)))
        ref_logits, ref_taps = _forward(model, sequence, layer_ids)
        for (a, b), name in (((logits[0], ref_logits[start:]), "logits"), ((taps[0], ref_taps[start:]), "taps")):
            rel = (a.float() - b).abs().max().item() / max(b.abs().max().item(), 1e-12)
            if name == "logits":
                worst_logits = max(worst_logits, rel)
            else:
                worst_taps = max(worst_taps, rel)
    return worst_logits, worst_taps


def greedy_divergence(model: torch.nn.Module, prompt: list[int], tokens: list[int], eos: set[int]) -> str | None:
    """Where transformers' greedy decoding of `prompt` leaves `tokens` (a greedy decode of target.pte), unless
    only at a tie of its own logits; None when they agree. Generation stops at EOS as the loops do."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=len(tokens), do_sample=False, eos_token_id=sorted(eos) or None,
                             output_logits=True, return_dict_in_generate=True)
    ref = out.sequences[0, len(prompt):].tolist()
    ref = next((ref[:i + 1] for i, t in enumerate(ref) if t in eos), ref)
    if ref == tokens:
        return None
    first = next(i for i, (a, b) in enumerate(zip(tokens + [-1], ref + [-1])) if a != b)
    if first < len(out.logits) and first < len(tokens):
        step = out.logits[first][0].float()
        gap = (step.max() - step[tokens[first]]).item() / max(step.abs().max().item(), 1e-12)
        if gap <= TIE:
            return None
    return f"plain greedy decoding of target.pte leaves transformers' greedy decoding at generated token {first}"
