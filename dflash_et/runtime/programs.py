"""Loading the exported programs with `executorch.runtime` and calling them like the eager models.

`TargetProgram` and `DraftProgram` have the eager models' call signatures, so the decoding
loops in `generate.py` drive them unchanged. Every limit a runner needs comes from the
programs' own constant methods (dflash_et.metadata).
"""

import json
from functools import cached_property
from pathlib import Path

import torch

from dflash_et.errors import REBUILD, ProgramError
from dflash_et.metadata import DRAFT_METHOD, TARGET_METHOD, DraftMeta, Metadata, TargetMeta, method_name
from dflash_et.runtime import native
from dflash_et.runtime.runtime_log import errors_only

# export.backend -> the id its delegate registers in the ExecuTorch runtime, and where that runtime has it
# (portable programs need no delegate)
RUNTIME_BACKENDS = {"xnnpack": ("XnnpackBackend", "a host whose executorch wheel has XNNPACK"),
                    "mlx": ("MLXBackend", "Apple silicon")}


def missing_backend(programs_dir: Path) -> str | None:
    """Why this host cannot run the programs in `programs_dir`, or None when it can (or nothing says).

    The backend they were lowered to is in their export.json (export and package both write it). MLX
    programs lower anywhere but only an executorch built for Apple silicon has their delegate; loading
    them elsewhere fails with an opaque runtime error, so validate and bench ask this first and skip.
    """
    if not (programs_dir / "export.json").is_file():
        return None
    backend = export_summary(programs_dir)["config"].get("backend")
    if backend not in RUNTIME_BACKENDS:
        return None
    from executorch.runtime import Runtime

    name, where = RUNTIME_BACKENDS[backend]
    if Runtime.get().backend_registry.is_available(name):
        return None
    return (f"programs need the {backend} backend ({name}), which this host's executorch runtime lacks; "
            f"run them on {where}")


def export_summary(programs_dir: Path) -> dict:
    """The programs' export.json (what package wrote: their export config, sizes), or one line that names it and
    how to get it back when it is missing or damaged."""
    path = programs_dir / "export.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProgramError(f"{path} is missing: {REBUILD}") from None
    except ValueError as e:
        raise ProgramError(f"{path} is not JSON ({e}): it is truncated or corrupt; {REBUILD}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
        raise ProgramError(f"{path} holds no export config: it was written by another tool, or is damaged; {REBUILD}")
    return summary


class Program:
    """One `.pte` (with its `.ptd` when the weights live outside it), the method a DFlash runner calls and
    the program's metadata record. `program`: that file already loaded, for a second method of it (the
    single layout's draft), whose weights and shared buffers then stay one copy."""

    METHOD: str
    META: type[Metadata]

    def __init__(self, pte: Path, ptd: Path | None = None, program=None):
        self.path = pte
        self.program = program or _load(pte, ptd)
        if self.METHOD not in self.program.method_names:
            raise ProgramError(f"{pte} has no {self.METHOD!r} method (it has {', '.join(sorted(self.program.method_names))}): "
                               "it was exported by another tool or an older dflash-et; re-export it (dvc repro)")
        try:
            self._method = self.program.load_method(self.METHOD)
        except RuntimeError as e:
            hint = (f" (it needs its .ptd weights file, {pte.parent / 'shared.ptd'}, which is missing: "
                    f"{REBUILD})") if ptd is None else ""
            raise ProgramError(f"{pte}: cannot be loaded by executorch.runtime{hint}: {e}") from None
        self.meta = self.META.read(self.program, str(pte))

    def execute(self, *args: torch.Tensor) -> list[torch.Tensor]:
        return self._method.execute(list(args))


class TargetProgram(Program):
    """target.pte; a hybrid one (`recurrent_state`) is refused calls that do not go forward, which would
    silently continue from the wrong recurrent state: one before the previous call or past its end, or one
    keeping more than `verify_rows` of a longer call but not all of it (models.deltanet)."""

    METHOD, META = TARGET_METHOD, TargetMeta

    def __init__(self, pte: Path, ptd: Path | None = None):
        super().__init__(pte, ptd)
        self.span = None  # the previous call's (start, end) in a hybrid target

    def __call__(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.meta.recurrent_state:
            start = int(input_pos[0])
            if start != 0 and not (self.span and self.span[0] <= start <= self.span[1]):
                raise ProgramError(f"{self.path}: a hybrid target's call must start at 0 (a new sequence) or within "
                                   f"the previous call (positions {self.span}), not at {start}: its recurrent state "
                                   "only goes forward")
            if start != 0 and self.meta.verify_rows < start - self.span[0] < self.span[1] - self.span[0]:
                raise ProgramError(f"{self.path}: a hybrid target's call may keep all of the previous call or at most "
                                   f"its first {self.meta.verify_rows} tokens, not {start - self.span[0]}")
            self.span = (start, start + tokens.shape[1])
        logits, hidden = self.execute(tokens, input_pos)
        return logits, hidden


class DraftProgram(Program):
    METHOD, META = DRAFT_METHOD, DraftMeta

    @property
    def context_window(self) -> int | None:
        """As the eager draft's (models.draft): its calls take no tap older than the window."""
        return self.meta.context_window

    returns_lattice = False  # as the eager draft's (models.draft): its program returns logits

    @cached_property
    def vocab_ids(self) -> torch.Tensor | None:
        """As the eager draft's (models.draft.reduce_head): the token id of each logit it returns, or None."""
        return None if self.meta.vocab_ids is None else torch.tensor(self.meta.vocab_ids)

    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """The logits, as the eager draft returns them."""
        return self.execute(tokens, hidden, input_pos)[0]


class DFlash2DraftProgram(DraftProgram):
    """A DFlash2 draft's program (its metadata has `selector_top_k`), which returns its lattice, as the eager
    DFlash2Draft does."""

    returns_lattice = True

    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(candidates, unary, pair), as the eager DFlash2Draft returns them."""
        candidates, unary, pair = self.execute(tokens, hidden, input_pos)
        return candidates, unary, pair


def draft_program(pte: Path, ptd: Path | None = None, program=None) -> DraftProgram:
    """The draft in `pte` (or in `program`, that file already loaded), as the class its metadata says it is: only a
    DFlash2 draft records `selector_top_k` (export writes no constant method for a field it leaves unset)."""
    program = program or _load(pte, ptd)
    lattice = method_name("selector_top_k") in program.method_names
    return (DFlash2DraftProgram if lattice else DraftProgram)(pte, ptd, program)


def load_programs(programs_dir: Path) -> tuple[TargetProgram, DraftProgram | None]:
    """The target and the draft from `programs_dir`: target.pte and draft.pte (with shared.ptd when present), or
    target.pte alone holding both (export.layout single), checked to be a pair; or a target exported without a
    draft (model.draft: none; its record has `max_block_len`) and None."""
    ptd = programs_dir / "shared.ptd"
    ptd = ptd if ptd.exists() else None
    target = TargetProgram(programs_dir / "target.pte", ptd)
    if (programs_dir / "draft.pte").exists():
        draft = draft_program(programs_dir / "draft.pte", ptd)
    elif DRAFT_METHOD in target.program.method_names:
        draft = draft_program(target.path, program=target.program)
    elif target.meta.max_block_len is not None:
        return target, None
    else:
        raise ProgramError(f"{programs_dir} has no draft.pte, and its target.pte no {DRAFT_METHOD!r} method "
                           f"(export.layout single puts the draft there): {REBUILD}")
    if (draft.meta.target_checkpoint_id != target.meta.checkpoint_id
            or draft.meta.target_layer_ids != target.meta.target_layer_ids):
        raise ProgramError(f"{draft.path} was exported for another target than {target.path}; "
                           "export both from the same pair")
    return target, draft


def max_block_len(target: TargetProgram, draft: DraftProgram | None) -> int:
    """The longest block the programs take: the draft's, or a target's exported without one."""
    return (draft or target).meta.max_block_len


def _load(pte: Path, ptd: Path | None):
    """The program in `pte` (its weights in `ptd`), loaded by executorch.runtime with the llama:: kernels it
    calls registered (before `load_method`, or loading fails with "Missing operator"): the C++ runner's, keyed over
    ExecuTorch's own (`native.use_runner_kernels`)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    errors_only()
    if not pte.is_file():
        raise ProgramError(f"{pte} is missing: {REBUILD}")
    if ptd is not None and not ptd.is_file():
        raise ProgramError(f"{ptd} is missing (the programs keep their weights there: export.shared_weights): "
                           f"{REBUILD}")
    why = missing_backend(pte.parent)
    if why:
        raise ProgramError(f"{pte}: {why}")
    native.use_runner_kernels()
    try:
        return Runtime.get().load_program(pte, data_path=ptd)
    except RuntimeError as e:
        damaged = pte if ptd is None or not _loads(pte) else ptd  # the program loads alone: its weights are damaged
        what = "ExecuTorch program" if damaged == pte else "weights file"
        raise ProgramError(f"{damaged} is not a readable {what} ({e}): truncated or corrupt; {REBUILD}") from None


def _loads(pte: Path) -> bool:
    """Whether `pte` loads without its .ptd (its methods then do not, but the program's own bytes are sound)."""
    from executorch.runtime import Runtime

    try:
        Runtime.get().load_program(pte)
    except RuntimeError:
        return False
    return True
