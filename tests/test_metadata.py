"""The programs speak ExecuTorch's language: ExecuTorch's own TextLLMRunner decodes target.pte's `forward`
as plain greedy decoding does, `forward` and `target` share one KV cache, and every runner reads the
metadata names dflash_et.metadata defines."""

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from dflash_et.data.chat import tokenizer
from dflash_et.errors import ProgramError
from dflash_et.metadata import DRAFT_METHOD, STOCK_METHOD, TARGET_METHOD, DraftMeta, TargetMeta, method_name
from dflash_et.runtime.generate import generate_ar
from dflash_et.runtime.programs import TargetProgram, load_programs
from tests.tiny_programs import MAX_SEQ_LEN, PREFILL_CHUNK, planned_arenas

HEADER = Path(__file__).resolve().parents[1] / "runner" / "src" / "metadata.h"


def test_the_cpp_runner_reads_the_names_python_defines():
    names = dict(re.findall(r'constexpr const char\* (k\w+) = "(\w+)";', HEADER.read_text()))
    methods = {names.pop("kTargetMethod"), names.pop("kDraftMethod")}
    assert methods == {TARGET_METHOD, DRAFT_METHOD}
    written = {method_name(f.name) for record in (TargetMeta, DraftMeta) for f in fields(record)}
    assert names and set(names.values()) <= written


def test_executorch_runner_names_mean_what_executorch_means(programs):
    target, draft = load_programs(programs)
    methods = target.program.method_names
    assert {STOCK_METHOD, TARGET_METHOD, "get_max_seq_len", "get_max_context_len", "use_kv_cache",
            "enable_dynamic_shape", "get_eos_ids", "get_vocab_size", "get_bos_id"} <= methods
    assert target.meta.max_seq_len == PREFILL_CHUNK and target.meta.max_context_len == MAX_SEQ_LEN
    assert target.meta.use_kv_cache is True and target.meta.enable_dynamic_shape is True
    assert {"get_max_block_len", "get_mask_token_id", "get_target_layer_ids"} <= draft.program.method_names


def test_forward_and_target_share_one_kv_cache(programs):
    """A stock runner's `forward` continues what DFlash's `target` wrote, and the reverse: one cache, planned
    as one arena both methods point at (a runtime that gives each method its own memory, as the C++ runners
    do, would otherwise keep two caches), and the weights stored once."""
    arenas = planned_arenas(programs / "target.pte")
    assert len(arenas[STOCK_METHOD]) == len(arenas[TARGET_METHOD]) == 3  # unused, activations, shared state
    assert arenas[STOCK_METHOD][2] == arenas[TARGET_METHOD][2] > 0
    summary = json.loads((programs / "export.json").read_text())["programs"]["target"]
    assert summary["bytes"] < 1.5 * summary["linears"]["target"]["bytes"]  # twice the weights would be over 2x
    target, _ = load_programs(programs)
    both = target.program.load_method(TARGET_METHOD), target.program.load_method(STOCK_METHOD)
    prompt, steps = torch.tensor([[5, 9, 14, 3, 22, 7]]), [torch.tensor([[11]]), torch.tensor([[4]]), torch.tensor([[30]])]
    reference = [both[0].execute([prompt, torch.arange(6)])[0]]
    reference += [both[0].execute([t, torch.tensor([6 + i])])[0] for i, t in enumerate(steps)]
    target.program.load_method(TARGET_METHOD).execute([torch.zeros(1, 16, dtype=torch.long), torch.arange(16)])  # other contents
    mixed = [both[0].execute([prompt, torch.arange(6)])[0]]
    mixed += [both[(i + 1) % 2].execute([t, torch.tensor([6 + i])])[0] for i, t in enumerate(steps)]
    assert len(both[1].execute([steps[0], torch.tensor([6])])) == 1  # logits alone
    for r, m in zip(reference, mixed):
        torch.testing.assert_close(m, r, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["programs", "single_programs", "shared_programs"])
def test_text_llm_runner_decodes_target_pte_greedily(layout, request):
    """ExecuTorch's own runner on target.pte and tokenizer.json (and shared.ptd, its data file, where the weights
    are shared), as a user would run it, gives the same greedy continuation as our plain decoding of the same
    program, in both layouts."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (the program's llama:: kernels)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    programs = request.getfixturevalue(layout)
    ptd = programs / "shared.ptd"
    assert ptd.exists() == (layout == "shared_programs")
    tok = tokenizer(programs)
    text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    target, _ = load_programs(programs)
    meta = target.meta
    ours = generate_ar(target, ids, 24, set(meta.eos_ids), meta.max_context_len, meta.max_seq_len).tokens
    pieces: list[str] = []
    runner = TextLLMRunner(str(programs / "target.pte"), str(programs / "tokenizer.json"),
                           str(ptd) if ptd.exists() else None)
    runner.generate(text, GenerationConfig(echo=False, max_new_tokens=len(ours), temperature=0.0), pieces.append)
    assert "".join(pieces) == tok.decode(ours)


class _Program:
    """A program without the names a newer dflash-et writes."""

    method_names = {"forward", "get_vocab_size"}

    def load_method(self, name):
        raise AssertionError("nothing to read")


@pytest.mark.parametrize("record", [TargetMeta, DraftMeta])
def test_programs_without_the_names_are_a_clear_error(record):
    with pytest.raises(ProgramError, match=r"^old\.pte lacks get_\w+: it was exported by another tool or an "
                                           r"older dflash-et; re-export it \(dvc repro\)$"):
        record.read(_Program(), "old.pte")


def test_a_program_without_the_dflash_method_is_a_clear_error(programs):
    """As a target.pte from before this layout (its one method `forward`) would be: named, with the fix."""
    with pytest.raises(ProgramError, match=r"draft\.pte has no 'target' method \(it has draft, get_\w+.*\): it was "
                                           r"exported by another tool or an older dflash-et; re-export it \(dvc repro\)$"):
        TargetProgram(programs / "draft.pte")
