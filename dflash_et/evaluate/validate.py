"""Proving the programs: numerics against the eager models, and lossless DFlash decoding.

Numerics: the same prefill / decode / verify / rollback calls go through each program and its
eager model (quantized the same way when the export was), and the worst error and argmax
agreement are kept with the prompt that produced them. Lossless: for every prompt, DFlash
driven by target.pte + draft.pte must emit exactly the tokens plain greedy decoding of the
same target.pte emits, and sampled DFlash must have the distribution of target.pte
(a statistical test against its exact probabilities, `same_distribution.py`). Programs without a draft
(model.draft: none) are checked the same way, their proposals lookup's.
"""

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dflash_et.export.config import ExportConfig
from dflash_et.export.loading import load_models
from dflash_et.runtime.adaptive import AUTO, auto_planner, lookup_planner
from dflash_et.runtime.cost_curve import measure_cost_curve
from dflash_et.runtime.generate import generate_ar, generate_dflash, unread
from dflash_et.checkpoints.load import checkpoint_id, has_draft
from dflash_et.evaluate.same_distribution import SamplingCheck, check_sampling
from dflash_et.runtime.programs import ProgramError, export_summary, load_programs, max_block_len, missing_backend
from dflash_et.data.chat import encode_chat, tokenizer
from dflash_et.data.prompts import load_prompts
from dflash_et.params import parse
from dflash_et.evaluate import transformers_oracle


@dataclass(frozen=True)
class Limits:
    """What a program must meet against its eager model: `validate.fp32` or `validate.reduced` of params.yaml
    (what each setting does: its comment there)."""

    max_rel_err: float
    min_token_agreement: float
    require_lossless: bool


@dataclass(frozen=True)
class ValidateConfig:
    """The `validate` section of params.yaml (what each setting does: its comments there; why reduced-precision
    programs get their own limits: docs/design.md#parameters-in-detail)."""

    prompts: int = 4
    prompt_set: str = "builtin"
    max_new_tokens: int = 32
    fp32: Limits = Limits(1e-3, 0.99, True)
    reduced: Limits = Limits(0.05, 0.9, True)
    sampling: SamplingCheck = SamplingCheck()

    @classmethod
    def from_params(cls, params: dict) -> "ValidateConfig":
        return parse(cls, params, "validate")


class Worst:
    """The largest value seen for a metric, and where."""

    def __init__(self):
        self.value, self.where = 0.0, None

    def update(self, value: float, where: str) -> None:
        if value > self.value or self.where is None:
            self.value, self.where = value, where


def call_plan(prompt: list[int], chunk: int, block: int, max_seq_len: int) -> list[tuple[list[int], int]]:
    """(tokens, start) calls: chunked prefill, one decode step, a verify block, and a rollback into it."""
    plan = [(prompt[i:i + chunk], i) for i in range(0, len(prompt), chunk)]
    p = len(prompt)
    filler = (prompt * (block // len(prompt) + 2))
    for tokens, start in [(filler[:1], p), (filler[1:block + 1], p + 1), (filler[2:block + 2][::-1], p + 3)]:
        if start + len(tokens) <= max_seq_len:
            plan.append((tokens, start))
    return plan


def _rel(a: torch.Tensor | tuple, b: torch.Tensor | tuple) -> tuple[float, float]:
    """Largest absolute error, and relative to the reference's largest magnitude. A DFlash2 draft's lattice is
    compared by its scores (unary, pair: its candidates' order is the scores' order), its candidates equal."""
    if isinstance(a, tuple):
        if not torch.equal(a[0], b[0]):
            return float("inf"), float("inf")
        a, b = torch.cat([a[1].flatten(), a[2].flatten()]), torch.cat([b[1].flatten(), b[2].flatten()])
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item()
    return err, err / max(b.abs().max().item(), 1e-12)


def compare_numerics(programs, eager, prompts: list[list[int]], labels: list[str], fp32=None) -> dict:
    """Worst absolute/relative errors of both programs (the target's alone without a draft) and the target's argmax
    agreement. With `fp32`, the fp32 models of a reduced-precision export, the same calls also say what the reduced
    precision costs the model: the target program against the fp32 target (`program_vs_fp32`) and its eager twin
    against it (`twin_vs_fp32`: XNNPACK quantizes each token's activations with its own rounding, and a deep model
    grows such differences as it grows the quantization's own error, so a program may be that far from its twin)."""
    target_p, draft_p = programs
    target_e, draft_e, settings = eager
    meta_t, largest = target_p.meta, max_block_len(*programs)
    worst = {k: Worst() for k in ("target_abs", "target_rel", "draft_abs", "draft_rel")}
    to_fp32 = {"program_vs_fp32": [0.0, 0], "twin_vs_fp32": [0.0, 0]}  # [worst relative error, argmaxes agreed]
    agree = total = 0
    for ids, label in zip(prompts, labels):
        for tokens, start in call_plan(ids, meta_t.max_seq_len, largest, meta_t.max_context_len):
            x, pos = torch.tensor([tokens]), torch.arange(start, start + len(tokens))
            with torch.no_grad():
                ref_logits, ref_taps = target_e(x, pos)
                full = fp32 and fp32[0](x, pos)
            logits, taps = target_p(x, pos)
            for name, (a, b) in {"logits": (logits, ref_logits), "taps": (taps, ref_taps)}.items():
                err, rel = _rel(a, b)
                worst["target_abs"].update(err, f"{label}, target {name} at {start}")
                worst["target_rel"].update(rel, f"{label}, target {name} at {start}")
            agree += (logits.argmax(-1) == ref_logits.argmax(-1)).sum().item()
            total += len(tokens)
            for key, (l, t) in ({"program_vs_fp32": (logits, taps), "twin_vs_fp32": (ref_logits, ref_taps)}.items()
                                if full else ()):
                to_fp32[key][0] = max(to_fp32[key][0], _rel(l, full[0])[1], _rel(t, full[1])[1])
                to_fp32[key][1] += (l.argmax(-1) == full[0].argmax(-1)).sum().item()
            block = min(largest, meta_t.max_context_len - start - len(tokens))
            if block >= 2 and draft_p is not None:
                draft_x = torch.tensor([[tokens[-1]] + [settings.mask_token_id] * (block - 1)])
                skip = unread(draft_p.meta.context_window, start, start + len(tokens))  # as decoding feeds it
                draft_taps, draft_pos = ref_taps[:, skip:], pos[skip:]
                with torch.no_grad():
                    ref = draft_e(draft_x, draft_taps, draft_pos)
                err, rel = _rel(draft_p(draft_x, draft_taps, draft_pos), ref)
                worst["draft_abs"].update(err, f"{label}, draft at {start}")
                worst["draft_rel"].update(rel, f"{label}, draft at {start}")
    compared = {key: {"target_rel_err": rel, "token_agreement": agreed / total}
                for key, (rel, agreed) in to_fp32.items()}
    return {"worst": worst, "token_agreement": agree / total, **(compared if fp32 else {})}


def check_lossless(programs, prompts: list[list[int]], labels: list[str], eos: set[int], max_new_tokens: int,
                   mask_token_id: int | None, blocks: list[int | str] | None = None) -> tuple[float, str | None, dict]:
    """DFlash over the programs vs plain greedy over target.pte, at `blocks` (default: block 2, the largest,
    and auto, deciding by a cost curve measured here, lookup proposals taking the rounds where they pay more;
    without a draft, lookup proposals alone).

    Returns the fraction of (prompt, block) runs that matched exactly, the first divergence, and tau per block.
    """
    target_p, draft_p = programs
    max_seq_len, chunk, largest = target_p.meta.max_context_len, target_p.meta.max_seq_len, max_block_len(*programs)
    blocks = blocks or [*sorted({2, largest}), AUTO]
    planner = lookups = None
    if AUTO in blocks:
        curve = measure_cost_curve(target_p, draft_p, largest, max_seq_len, mask_token_id, chunk, repeats=1)
        planner, lookups = auto_planner(curve, largest) if draft_p else None, lookup_planner(curve, largest)
    taus: dict[int | str, list[float]] = {}
    matched, runs, first_divergence = 0, 0, None
    for ids, label in zip(prompts, labels):
        reference = generate_ar(target_p, ids, max_new_tokens, eos, max_seq_len, chunk).tokens
        for block in blocks:
            out = generate_dflash(target_p, draft_p, ids, max_new_tokens, eos, max_seq_len, chunk,
                                  largest if block == AUTO else block, mask_token_id,
                                  planner=planner if block == AUTO else None,
                                  lookup_planner=lookups if block == AUTO else None)
            taus.setdefault(block, []).append(out.tau)
            runs += 1
            if out.tokens == reference:
                matched += 1
            elif first_divergence is None:
                first = next(i for i, (a, b) in enumerate(zip(out.tokens + [-1], reference + [-1])) if a != b)
                first_divergence = (f"DFlash at block {block} diverges from plain greedy decoding of target.pte "
                                    f"at generated token {first} on {label}")
    return matched / runs, first_divergence, taus


def _text(prompt: str | list[dict]) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def against_transformers(programs, target_dir: Path, layer_ids: list[int], prompts: list[list[int]],
                         labels: list[str], eos: set[int], max_new_tokens: int) -> dict:
    """target.pte against transformers' model of the checkpoint (see transformers_oracle): the worst relative
    error of logits and taps over the call plan, and whether plain greedy decoding agrees (ties aside)."""
    target_p = programs[0]
    model = transformers_oracle.load_reference(target_dir)
    meta = target_p.meta
    worst, divergence = [0.0, 0.0], None
    for ids, label in zip(prompts, labels):
        plan = call_plan(ids, meta.max_seq_len, max_block_len(*programs), meta.max_context_len)
        worst = [max(w, e) for w, e in zip(worst, transformers_oracle.compare_calls(target_p, model, plan, layer_ids))]
        tokens = generate_ar(target_p, ids, max_new_tokens, eos, meta.max_context_len, meta.max_seq_len).tokens
        where = transformers_oracle.greedy_divergence(model, ids, tokens, eos)
        divergence = divergence or (where and f"{where} on {label}")
    return {"logits_rel_err": worst[0], "taps_rel_err": worst[1], "greedy_divergence": divergence}


def _check_made_from(programs, target_dir: Path, draft_dir: Path) -> None:
    """Refuse programs exported from other checkpoints than the ones given (their fingerprints differ), or with a
    draft where model.draft is none, or without one where it names one."""
    target_p, draft_p = programs
    if (draft_p is not None) != has_draft(draft_dir):
        raise ProgramError(f"the programs were exported {'with' if draft_p else 'without'} a draft, and {draft_dir} "
                           f"{'is model.draft: none' if draft_p else 'holds one'}; rebuild the programs (dvc repro)")
    made = [(target_p, target_dir, target_p.meta.checkpoint_id)]
    if draft_p is not None:
        made.append((draft_p, draft_dir, draft_p.meta.draft_checkpoint_id))
    for program, ckpt, made_from in made:
        if made_from != checkpoint_id(ckpt):
            raise ProgramError(f"{program.path} was exported from another checkpoint than {ckpt}; rebuild the "
                               "programs (dvc repro) or point validate at the matching weights")


def _failures(numerics: dict, fp32: dict | None, quantized: dict | None, oracle: dict, why: str | None,
              sampling: dict, limits: Limits, draft_limits: Limits) -> list[str]:
    """Every check that missed its limit, one line each (empty: validate passed). A quantized target's values may
    differ from its eager twin's as much as the quantization moves the twin's from the fp32 model's
    (`compare_numerics`'s `twin_vs_fp32`); its argmaxes are held to the twin's as they are."""
    worst = numerics["worst"]
    target_limits = limits if quantized is None else replace(
        limits, max_rel_err=max(limits.max_rel_err, quantized["target_rel_err"]))
    failures = [f"{name}_rel_err {worst[f'{name}_rel'].value:.3g} > {lim.max_rel_err:.3g} on "
                f"{worst[f'{name}_rel'].where}"
                for name, lim in (("target", target_limits), ("draft", draft_limits))
                if worst[f"{name}_rel"].value > lim.max_rel_err]
    if numerics["token_agreement"] < limits.min_token_agreement:
        failures.append(f"token_agreement {numerics['token_agreement']:.4f} < {limits.min_token_agreement}"
                        + (f" (with the fp32 model: {fp32['token_agreement']:.4f}; when that is low too, the "
                           f"quantization is too coarse for this model: try export.quantize=8da8w)" if fp32 else ""))
    for key in ("logits", "taps"):
        if oracle.get(f"{key}_rel_err", 0.0) > limits.max_rel_err:
            failures.append(f"target {key} differ from transformers' model by {oracle[f'{key}_rel_err']:.3g} "
                            f"(relative) > {limits.max_rel_err:g}")
    if oracle.get("greedy_divergence"):
        failures.append(oracle["greedy_divergence"])
    if why and limits.require_lossless:
        failures.append(why)
    if not sampling["same_distribution"] and limits.require_lossless:
        failures.append(f"sampled DFlash differs from target.pte's distribution: chi-square p-value "
                        f"{sampling['min_p_value']:.2g} < {sampling['threshold']:.2g} on {sampling['where']}")
    return failures


def validate(programs_dir: Path, target_dir: Path, draft_dir: Path, config: ValidateConfig) -> dict:
    """Run every check; returns the report (with `failures`, empty when all passed).

    Programs this host cannot run (MLX ones anywhere but Apple silicon) are not a failure of the programs:
    the report is then `skipped` with the reason, so the pipeline goes on and validate runs where they can.
    """
    skipped = missing_backend(programs_dir)
    if skipped:
        return {"skipped": skipped, "failures": []}
    programs = load_programs(programs_dir)
    _check_made_from(programs, target_dir, draft_dir)
    export_config = ExportConfig.from_params(export_summary(programs_dir)["config"])
    # the eager twin of each program, loaded as export loads it: same dtype, same quantization
    eager = load_models(target_dir, draft_dir, export_config, programs[0].meta.max_context_len)
    mask_token_id = eager[2].mask_token_id if eager[2] else None
    tok = tokenizer(target_dir)
    rows = load_prompts(config.prompt_set, config.prompts)
    prompts = [encode_chat(tok, r["prompt"]) for r in rows]
    labels = [f"prompt {i} ({_text(r['prompt'])[:40]!r})" for i, r in enumerate(rows)]

    exact = export_config.quantize == "none" and export_config.dtype == "fp32"
    # What the reduced precision costs the model itself: the program and its twin against the fp32 target
    full_precision = replace(export_config, dtype="fp32", quantize="none", draft_head="same")
    fp32_models = None if exact else load_models(target_dir, draft_dir, full_precision,
                                                 programs[0].meta.max_context_len)
    numerics = compare_numerics(programs, eager, prompts, labels, fp32_models)
    fp32, quantized = numerics.get("program_vs_fp32"), numerics.get("twin_vs_fp32")
    eos = set(programs[0].meta.eos_ids)
    limits = config.fp32 if exact else config.reduced
    oracle = against_transformers(programs, target_dir, list(programs[0].meta.target_layer_ids), prompts, labels, eos,
                                  config.max_new_tokens) if exact else \
        {"skipped": "reduced precision: compared with its quantized eager twin only"}
    lossless_fraction, why, taus = check_lossless(programs, prompts, labels, eos, config.max_new_tokens,
                                                  mask_token_id)
    sampling = check_sampling(programs, prompts, labels, eos, mask_token_id, config.sampling)
    worst = numerics["worst"]
    # an int8 draft head (export.draft_head) makes the draft reduced precision; the target alone decides exactness
    draft_limits = limits if export_config.draft_head == "same" else config.reduced
    failures = _failures(numerics, fp32, quantized, oracle, why, sampling, limits, draft_limits)
    return {
        "target_max_abs_err": worst["target_abs"].value, "target_rel_err": worst["target_rel"].value,
        **({"draft_max_abs_err": worst["draft_abs"].value, "draft_rel_err": worst["draft_rel"].value}
           if programs[1] else {"draft": None}),
        "token_agreement": numerics["token_agreement"], "lossless": why is None,
        "lossless_fraction": lossless_fraction,
        "tau_by_block": {str(b): sum(v) / len(v) for b, v in taus.items()},
        "fp32_reference": fp32 or {"skipped": "fp32 program: the eager twin is the fp32 model"},
        "quantized_model": quantized or {"skipped": "fp32 program: nothing quantized"},
        "divergence": why, "sampling": sampling, "transformers": oracle, "prompts": len(prompts),
        "limits": asdict(limits),
        "failures": failures,
    }
