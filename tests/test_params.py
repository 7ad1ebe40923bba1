"""params.yaml's one parser (dflash_et.params): every section parses into its dataclass, a key it does not know is
refused in one line, and each dataclass default equals params.yaml's value (so code and params.yaml cannot drift)."""

import sys
from dataclasses import fields, is_dataclass

import pytest
import yaml

from dflash_et.errors import ExportError, UserError
from dflash_et.export.config import ExportConfig
from dflash_et.params import SECTIONS as TOP_LEVEL, Model, params, parse
from dflash_et.evaluate.bench import BenchConfig
from dflash_et.evaluate.peers import PeerConfig
from dflash_et.evaluate.validate import Limits, ValidateConfig
from dflash_et.training.config import train_config
from dflash_et.training.train import TrainConfig
from stages import common
from tests import REPO

# section -> (its dataclass, how the stages build it from params(), keys of the section that are not the class's)
SECTIONS = {
    "model": (Model, lambda p: p["model"], ()),
    "export": (ExportConfig, lambda p: ExportConfig.from_params({k: v for k, v in p["export"].items() if k != "gguf"}),
               ("gguf",)),  # the package stage's
    "validate": (ValidateConfig, lambda p: ValidateConfig.from_params(p["validate"]), ()),
    "bench": (BenchConfig, lambda p: parse(BenchConfig, p["bench"], "bench"), ()),
    "peers": (PeerConfig, lambda p: PeerConfig.from_params(p["peers"]), ()),
    "train_draft": (TrainConfig, train_config, ()),
}
OUTSIDE = {"train_draft": {"embed_scale", "max_seq_len"}}  # set from model.draft_embed_scale, export.max_seq_len


@pytest.fixture
def repo_params(monkeypatch) -> dict:
    monkeypatch.chdir(REPO)  # the stages read params.yaml from the working directory, as under dvc
    return params()


def test_the_top_level_is_every_section_and_setting(repo_params):
    assert tuple(yaml.safe_load((REPO / "params.yaml").read_text())) == TOP_LEVEL
    assert set(SECTIONS) == {k for k, v in repo_params.items() if isinstance(v, dict) or is_dataclass(v)}


@pytest.mark.parametrize("section", SECTIONS)
def test_every_section_parses_and_its_defaults_are_params_yaml(repo_params, section):
    cls, build, others = SECTIONS[section]
    config = build(repo_params)
    assert type(config) is cls
    # every setting of the class is in params.yaml (nested sections too), and its default is params.yaml's value
    raw = yaml.safe_load((REPO / "params.yaml").read_text())[section]
    assert _keys(cls, raw, section, OUTSIDE.get(section, set()), others) == []
    assert config == cls(**{name: getattr(config, name) for name in OUTSIDE.get(section, ())})


def _keys(cls, raw: dict, name: str, outside: set, others=()) -> list[str]:
    """What differs between the fields of `cls` and the keys of its section `raw`, nested sections included."""
    names = [f.name for f in fields(cls) if f.name not in outside]
    diff = sorted(set(names) ^ (set(raw) - set(others)))
    for f in fields(cls):
        if is_dataclass(f.type) and f.name in raw:
            diff += _keys(f.type, raw[f.name], f"{name}.{f.name}", set())
    return [f"{name}.{key}" for key in diff]


@pytest.mark.parametrize("section", [*SECTIONS, "validate.fp32", "validate.sampling"])
def test_an_unknown_key_is_refused_in_one_line(repo_params, section):
    top, _, sub = section.partition(".")
    cls, build, _ = SECTIONS[top]
    p = {**repo_params, top: {**_raw(repo_params[top])}}
    target = p[top]
    if sub:
        target[sub] = {**target[sub], "colour": "red"}
    else:
        target["colour"] = "red"
    if top == "model":
        p["model"] = target
        with pytest.raises(UserError) as e:
            parse(Model, target, "model")
    else:
        with pytest.raises(UserError) as e:
            build(p)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{section}.colour is not a setting; the {section} section takes ")
    assert isinstance(e.value, ExportError) == (top == "export")


def _raw(section):
    return {f.name: getattr(section, f.name) for f in fields(section)} if is_dataclass(section) else section


def test_a_missing_setting_without_a_default_is_refused_and_the_rest_default():
    with pytest.raises(UserError, match=r"^validate.fp32.min_token_agreement is missing; the validate.fp32 section "
                                        r"takes max_rel_err, min_token_agreement, require_lossless$"):
        ValidateConfig.from_params({"fp32": {"max_rel_err": 1e-3}})
    assert parse(Limits, {"max_rel_err": 1, "min_token_agreement": 0.5, "require_lossless": False}, "x") == \
        Limits(1, 0.5, False)
    assert parse(BenchConfig, {"num_prompts": 2, "block_sizes": [4, 8]}, "bench") == \
        BenchConfig(num_prompts=2, block_sizes=(4, 8))  # lists become tuples
    with pytest.raises(UserError, match=r"^bench must be a section of settings \(key: value\), got 3$"):
        parse(BenchConfig, 3, "bench")
    with pytest.raises(UserError, match=r"^train_draft.embed_scale is not a setting; the train_draft section takes "
                                        r"steps, "):
        parse(TrainConfig, {"embed_scale": 2.0}, "train_draft", outside={"embed_scale": None})


def test_the_draft_trains_at_the_positions_its_program_holds(repo_params):
    repo_params["export"]["max_seq_len"] = 4096
    assert train_config(repo_params).max_seq_len == 4096


def test_a_given_target_replaces_model_target_and_its_auto_prompt_sets(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("model: {target: builtin}\nbench: {prompts: auto}\n"
                                          "train_draft: {prompts: auto}\nvalidate: {prompt_set: builtin}\n")
    monkeypatch.chdir(tmp_path)
    assert params()["bench"]["prompts"] == "builtin"
    p = params("smollm2")
    assert p["model"].target == "smollm2" and p["bench"]["prompts"] == p["train_draft"]["prompts"] == "assistant"
    assert p["validate"]["prompt_set"] == "builtin"  # set, not auto


def test_an_unknown_section_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("block_size: 16\nbnech: {num_prompts: 2}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^bnech is not a section of params.yaml; it has block_size, model, "):
        params()


@pytest.mark.parametrize("stage, section, argv", [
    ("stages.fetch", "model", ["out"]),
    ("stages.fetch_draft", "train_draft", ["target", "draft", "live"]),
    ("dflash_et.cli", "train_draft", ["train-draft", "target", "out"]),  # `dflash train-draft`
    ("stages.export", "export", ["target", "target", "draft", "out"]),
    ("stages.validate", "validate", ["programs", "target", "draft", "report.json"]),
    ("stages.bench", "bench", ["programs", "bench.json", "plots", "curve.json"]),
    ("stages.peer_bench", "peers", ["programs", "target", "draft", "curve.json", "gguf", "peers.json", "peers.csv"]),
])
def test_each_stage_refuses_an_unknown_key_of_its_section_in_one_line(tmp_path, monkeypatch, stage, section, argv):
    import importlib

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params[section]["colour"] = "red"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [stage, *argv])
    with pytest.raises(SystemExit) as e:
        common.run(importlib.import_module(stage).main)
    assert str(e.value).startswith(f"error: {section}.colour is not a setting; the {section} section takes ")
    assert "\n" not in str(e.value) and sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_a_stage_prints_each_progress_line_once_when_a_dependency_configured_logging(tmp_path):
    """Some dependency configures the root logger on import (`make repro` printed every `[lower]` line twice, the
    second as `INFO:dflash_et.export.lower:...`); the stage's own handler is the only one that prints it."""
    import subprocess

    code = ("import logging; logging.basicConfig(level=logging.INFO); from stages.common import show_progress; "
            "show_progress(); logging.getLogger('dflash_et.export.lower').info('lowering target')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert [line for line in (out.stdout + out.stderr).splitlines() if "lowering target" in line] == \
        ["[<string>] lowering target"]
