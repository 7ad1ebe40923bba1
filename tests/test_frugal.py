"""export.frugal and export.upstream_patches: a program emitted with its constants as file ranges is the program
emitted with bytes copies; another ExecuTorch release, or a small pair, exports as ExecuTorch does."""

import hashlib
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from dflash_et.export.config import ExportConfig
from dflash_et.export.frugal import FileRange
from dflash_et.export.upstream_patches import spilling

SMALL_EXPORT = ExportConfig(max_seq_len=32, prefill_chunk=4, max_block_size=4, stock_forward=False)


def test_file_range_reads_its_bytes_alone(tmp_path: Path):
    f = tmp_path / "data"
    f.write_bytes(b"head" + bytes(range(256)) * 300 + b"tail")
    r = FileRange(str(f), 4, 256 * 300)
    assert len(r) == 256 * 300 and r.to_bytes() == bytes(range(256)) * 300 and r.prefix(3) == b"\0\1\2"
    assert r.sha256() == hashlib.sha256(bytes(range(256)) * 300).digest()


class _Net(torch.nn.Module):
    def __init__(self, mapped: torch.Tensor):
        super().__init__()
        self.mapped = torch.nn.Parameter(mapped, requires_grad=False)  # a file's mapping, as a checkpoint's weights
        self.own = torch.nn.Parameter(torch.randn(48, 32), requires_grad=False)  # anonymous memory: spooled
        self.register_buffer("cache", torch.zeros(4, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.add_(x[:1])
        return x @ self.mapped.T @ self.own + self.cache.sum()


def _program(model: torch.nn.Module) -> bytes:
    from executorch.exir import to_edge

    return to_edge(torch.export.export(model, (torch.randn(4, 32),))).to_executorch().buffer


def test_spilled_program_is_the_unspilled_one(tmp_path: Path):
    weights = tmp_path / "weights.bin"
    torch.randn(48, 32).numpy().tofile(weights)
    model = _Net(torch.from_file(str(weights), shared=False, size=48 * 32).view(48, 32)).eval()
    plain = _program(model)
    with spilling(tmp_path) as spiller:
        spilled = _program(model)
        assert spiller.end == 48 * 32 * 4  # the mapped weight was not spooled, the anonymous one was
    assert spilled == plain
    assert list(tmp_path.iterdir()) == [weights]  # the spool is gone


def _rss_file() -> int:
    """This process's resident pages of mapped files, in bytes."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("RssFile:")).split()[1]) * 1024


def _mapped_file(path: Path, data: torch.Tensor) -> torch.Tensor:
    path.write_bytes(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return torch.from_file(str(path), shared=False, size=data.numel(), dtype=data.dtype).view(data.shape)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="resident pages are read from Linux's /proc")
def test_drop_lets_a_mapped_tensors_pages_go_and_leaves_memory_alone(tmp_path: Path):
    from dflash_et.resident import drop

    data = torch.arange(1 << 22, dtype=torch.float32)  # 16 MiB
    mapped = _mapped_file(tmp_path / "weights.bin", data)
    assert torch.equal(mapped, data)  # read: resident
    before = _rss_file()
    drop(mapped)
    assert _rss_file() < before - (12 << 20)
    assert torch.equal(mapped, data)  # read again, from the file
    own = data.clone()
    drop(own)  # anonymous memory: MADV_DONTNEED would zero it
    assert torch.equal(own, data)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="resident pages are read from Linux's /proc")
def test_a_weight_converted_into_the_spool_is_its_conversion_and_stays_out_of_memory(tmp_path: Path, monkeypatch):
    from dflash_et.export import frugal

    data = torch.randn(512, 4096).to(torch.bfloat16)  # 4 MiB stored, 8 MiB converted
    mapped = _mapped_file(tmp_path / "weights.bin", data)
    monkeypatch.setattr(frugal, "CHUNK", 1 << 16)  # blocks of 4 rows
    with spilling(tmp_path) as spiller:
        before = _rss_file()
        converted = spiller.converted(mapped, torch.float32)
        assert _rss_file() < before + (2 << 20)  # neither the checkpoint's pages nor the conversion resident
        assert spiller.holds(converted.untyped_storage()) and torch.equal(converted, data.float())
        assert spiller.converted(converted, torch.float32) is converted  # in its dtype already: as it is


def test_a_pre_quantized_checkpoint_is_refused_in_one_line(tmp_path: Path):
    from safetensors.torch import load_file, save_file

    from dflash_et.checkpoints.load import load_target
    from dflash_et.errors import CheckpointError
    from tests.tiny_checkpoints import random_checkpoint

    target = random_checkpoint(tmp_path / "target", "qwen3")
    weights = load_file(target / "model.safetensors")
    key = next(k for k in weights if k.endswith("q_proj.weight"))
    weights[key] = weights[key].to(torch.float8_e4m3fn)
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"^target .*: {key} is stored as torch.float8_e4m3fn, which is not "
                                              r"supported; use a checkpoint in bf16, fp16 or fp32 \(.*\)$"):
        load_target(target, [1], 64)


@pytest.mark.slow  # lowers programs
@pytest.mark.parametrize("params, stored", [(dict(quantize="8da4w"), torch.bfloat16),
                                            (dict(backend="mlx", dtype="bf16", quantize="4w"), torch.float32),
                                            (dict(dtype="fp32"), torch.float32)],
                         ids=["8da4w-from-bf16", "mlx-4w-from-fp32", "fp32"])
def test_a_frugal_export_writes_the_plain_ones_program(params, stored, tmp_path: Path, monkeypatch):
    """Quantized weights, converted ones and the delegates' constants kept in the spool (and out of memory), and
    weights quantized or converted a block of rows at a time (export.by_rows, frugal.Spiller.converted), change
    no byte of the program: the same export with `spilling` a no-op and whole weights quantized at once writes
    the same target.pte. `stored`: the checkpoint's dtype (a bf16 one for an fp32 program is converted)."""
    from contextlib import nullcontext

    from safetensors.torch import load_file, save_file

    from dflash_et.export import by_rows, frugal, lower
    from tests.tiny_checkpoints import chat_checkpoint, random_draft

    target = chat_checkpoint(tmp_path / "target", "gemma4_text", num_hidden_layers=2,
                             layer_types=["sliding_attention", "full_attention"])
    weights = target / "model.safetensors"
    save_file({k: v.to(stored) for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    draft = random_draft(tmp_path / "draft", target, num_layers=1)
    config = ExportConfig(max_seq_len=32, prefill_chunk=4, max_block_size=4, stock_forward=False, **params)
    monkeypatch.setattr(frugal, "SPILL_FROM_BYTES", 0)  # a pair of a few MB: spilled all the same
    monkeypatch.setattr(by_rows, "ROW_BLOCK", 7 * 64 * 4)  # 7 rows of a hidden-wide weight, 3 of a wider one: ragged
    monkeypatch.setattr(frugal, "CHUNK", 256)
    repacked = _mlx_repacked_files(monkeypatch) if config.backend == "mlx" else None
    lower.export_program("target", target, draft, config, tmp_path / "frugal")
    if repacked is not None:  # MLX's repacked weights were in the spool, not in memory, when it serialized them
        assert repacked and all(f is not None and Path(f[0]).name.startswith("dflash-spool-") for f in repacked)
        monkeypatch.undo()
    monkeypatch.setattr(by_rows, "ROW_BLOCK", 1 << 40)
    monkeypatch.setattr(frugal, "CHUNK", 1 << 24)
    monkeypatch.setattr(lower, "spilling", lambda directory, mlx: nullcontext())
    lower.export_program("target", target, draft, config, tmp_path / "plain")
    assert (tmp_path / "frugal" / "target.pte").read_bytes() == (tmp_path / "plain" / "target.pte").read_bytes()
    assert sorted(p.name for p in (tmp_path / "frugal").iterdir()) == ["export.json", "target.pte"]  # no spool left


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A small pair and its draft.pte exported with spilling (forced: the pair is a few MB)."""
    from dflash_et.export import frugal, lower
    from tests.tiny_checkpoints import chat_checkpoint, random_draft

    tmp = tmp_path_factory.mktemp("small_pair")
    target = chat_checkpoint(tmp / "target", "qwen3", num_hidden_layers=2)
    draft = random_draft(tmp / "draft", target, num_layers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frugal, "SPILL_FROM_BYTES", 0)
        lower.export_program("draft", target, draft, SMALL_EXPORT, tmp / "spilled")
    return target, draft, tmp / "spilled" / "draft.pte"


def test_another_executorch_release_exports_as_executorch_does(small_pair, tmp_path: Path, monkeypatch):
    """`spilling` replaces ExecuTorch 1.5.1's private internals; under another release (a stub version string) it
    patches nothing and says so in one line, and the export still writes the same program, which loads and runs
    as the eager draft does."""
    import logging

    from dflash_et.export import frugal, lower, upstream_patches
    from dflash_et.export.loading import load_models
    from dflash_et.runtime.programs import DraftProgram

    target, draft, spilled = small_pair
    installed = upstream_patches.version
    monkeypatch.setattr(upstream_patches, "version", lambda name: "1.6.0" if name == "executorch" else installed(name))
    monkeypatch.setattr(frugal, "SPILL_FROM_BYTES", 0)
    entered = _entered(monkeypatch)
    said = _said(logging.getLogger(upstream_patches.__name__), monkeypatch)
    lower.export_program("draft", target, draft, SMALL_EXPORT, tmp_path)
    assert entered == [(None, False)]  # asked to spill, and nothing of ExecuTorch's replaced
    assert said == ["executorch 1.6.0 (not 1.5.1): frugal export replaces internals of executorch 1.5.1 and torch "
                    "2.13.0 only, so this export serializes as ExecuTorch does (more memory: about 2.5x the program's "
                    "size)"]
    assert (tmp_path / "draft.pte").read_bytes() == spilled.read_bytes()
    _, eager, settings = load_models(target, draft, SMALL_EXPORT, 32)
    block = torch.tensor([[1] + [settings.mask_token_id] * 3])
    hidden = torch.randn(1, 2, eager.fc.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = eager(block, hidden, torch.arange(2))
    torch.testing.assert_close(DraftProgram(tmp_path / "draft.pte")(block, hidden, torch.arange(2)), expected,
                               rtol=1e-4, atol=1e-4)


def test_a_pair_spills_from_its_checkpoints_size_on(small_pair, tmp_path: Path, monkeypatch):
    """frugal.pays: an export spills when its pair's checkpoints hold SPILL_FROM_BYTES or more, and exports as
    ExecuTorch does below; the threshold is set one byte over this pair's size, then at it, so neither side
    passes by accident (a small pair never spills by default). The programs are the same either way."""
    from dflash_et.checkpoints.load import weight_files
    from dflash_et.export import frugal, lower

    target, draft, spilled = small_pair
    size = sum(f.stat().st_size for d in (target, draft) for f in weight_files(d))
    assert size < frugal.SPILL_FROM_BYTES
    entered = _entered(monkeypatch)
    monkeypatch.setattr(frugal, "SPILL_FROM_BYTES", size + 1)
    lower.export_program("draft", target, draft, SMALL_EXPORT, tmp_path / "under")
    assert entered == []
    monkeypatch.setattr(frugal, "SPILL_FROM_BYTES", size)
    lower.export_program("draft", target, draft, SMALL_EXPORT, tmp_path / "at")
    assert len(entered) == 1 and isinstance(entered[0][0], frugal.Spiller) and entered[0][1]  # ExecuTorch's patched
    assert (tmp_path / "under" / "draft.pte").read_bytes() == (tmp_path / "at" / "draft.pte").read_bytes() \
        == spilled.read_bytes()


def _entered(monkeypatch) -> list[tuple]:
    """What each `spilling` an export enters yields (a Spiller; None: it replaced nothing) and whether ExecuTorch's
    emitter was patched inside it, recorded into the list returned."""
    from executorch.exir.emit import _emitter

    from dflash_et.export import lower

    entered, plain = [], lower.spilling

    @contextmanager
    def recorded(directory: Path, mlx: bool):
        with plain(directory, mlx) as spiller:
            entered.append((spiller, hasattr(_emitter, "bytes")))
            yield spiller

    monkeypatch.setattr(lower, "spilling", recorded)
    return entered


def _said(log, monkeypatch) -> list[str]:
    """What `log` says at INFO from now on, recorded into the list returned."""
    import logging

    said, handler = [], logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    monkeypatch.setattr(log, "handlers", [*log.handlers, handler])
    monkeypatch.setattr(log, "level", logging.INFO)
    return said


def _mlx_repacked_files(monkeypatch) -> list:
    """Where MLX's builder holds each weight it repacked (the file it is mapped from; None: memory) when it starts
    serializing them, recorded into the list returned."""
    from dflash_et.models.mlx_ops import ensure_mlx_backend
    from dflash_et.resident import Mappings

    ensure_mlx_backend()
    from executorch.backends.mlx.builder.program_builder import MLXProgramBuilder

    where, serialize = [], MLXProgramBuilder.get_named_data_store

    def recorded(builder: MLXProgramBuilder):
        maps = Mappings()
        where.extend(maps.file_of(t.data_ptr(), t.nbytes) for t in builder.extra_constants.values() if t.nbytes >= 64)
        return serialize(builder)

    monkeypatch.setattr(MLXProgramBuilder, "get_named_data_store", recorded)
    return where


@pytest.mark.parametrize("rows_at_once", [1, 7, 64])
def test_hqq_by_rows_is_torchaos_hqq(rows_at_once, monkeypatch):
    """by_rows' HQQ, a block of rows at a time, gives torchao's whole-weight HQQ values, early stop included
    (a weight whose scales settle at once and one that iterates)."""
    from torchao.quantization.quant_primitives import _choose_qparams_and_quantize_scale_only_hqq as torchaos

    from dflash_et.export import by_rows

    g = torch.Generator().manual_seed(0)
    monkeypatch.setattr(by_rows, "ROW_BLOCK", rows_at_once * 128 * 4)
    for weight in (torch.randn(64, 128, generator=g).to(torch.bfloat16), torch.ones(64, 128, dtype=torch.bfloat16)):
        for group in (32, 128):
            q, scale = by_rows._hqq(weight, [1, group], -8, 7)
            q0, scale0 = torchaos(weight, [1, group], -8, 7)
            assert q.dtype == torch.int8 and q.equal(q0.to(torch.int8)) and scale.equal(scale0)


def test_a_recipe_not_one_row_per_row_is_refused(monkeypatch):
    """by_rows stitches torchao's blocks of rows back together: a quantized layout that holds anything but one row
    per row of the weight (a packed one) would be stitched wrong, so it is refused."""
    import torchao.quantization
    from torchao.quantization.quant_api import Int8WeightOnlyConfig

    from dflash_et.export import by_rows

    real = torchao.quantization.quantize_

    def packed(module: torch.nn.Module, config) -> None:  # torchao's own layout, two rows to a row of its data
        real(module, config)
        names, attributes = module.weight.__tensor_flatten__()
        inner = {name: getattr(module.weight, name) for name in names}
        inner["qdata"] = inner["qdata"].reshape(-1, 2 * module.weight.shape[1])
        module.weight = torch.nn.Parameter(type(module.weight).__tensor_unflatten__(
            inner, attributes, module.weight.shape, module.weight.stride()), requires_grad=False)

    monkeypatch.setattr(torchao.quantization, "quantize_", packed)
    with pytest.raises(ValueError, match=r"^Int8Tensor.qdata is not one row per row of the weight$"):
        by_rows.quantize_affine(torch.nn.Linear(64, 8, bias=False), Int8WeightOnlyConfig())
