"""Every file of a programs folder that `dflash generate`, validate and bench read, missing or damaged, is refused in
one line that names the file and how to get it back (rebuild it with `dvc repro package`, or `dvc pull` it again),
not with what the library that reads it says (transformers' four lines, a bare "Expecting value: line 2 column 1")."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_et.checkpoints.builtin import build_tokenizer
from dflash_et.data.chat import tokenizer
from dflash_et.errors import ProgramError, UserError
from dflash_et.runtime.programs import export_summary, load_programs, missing_backend

REBUILD = r"rebuild it \(`dvc repro package` .*\) or pull it again \(`dvc pull`\)$"


@pytest.fixture
def tokenizer_folder(tmp_path) -> Path:
    """The built-in tokenizer's files as package ships them (tokenizer.json, tokenizer_config.json, the template)."""
    folder = tmp_path / "programs"
    build_tokenizer().save_pretrained(folder)
    assert tokenizer(folder).chat_template is not None
    return folder


@pytest.mark.parametrize("name, damage, error", [
    ("tokenizer.json", "missing", r"^{folder}/tokenizer.json is missing: " + REBUILD),
    ("tokenizer.json", "truncated",
     r"^{folder}/tokenizer.json is not JSON \(.*\): it is truncated or corrupt; " + REBUILD),
    ("tokenizer_config.json", "truncated",
     r"^{folder}/tokenizer_config.json is not JSON \(Expecting value: line 2 column 1 \(char 12\)\): it is truncated "
     r"or corrupt; " + REBUILD),
    ("tokenizer_config.json", "empty", r"^{folder}/tokenizer_config.json is not JSON \(.*\): it is truncated or "),
    ("tokenizer.json", "another shape",
     r"^{folder}: transformers cannot build a tokenizer from its files \(TypeError: .*\); one of them is damaged: "
     + REBUILD),
    ("tokenizer_config.json", "another shape",
     r"^{folder}: transformers cannot build a tokenizer from its files \(AttributeError: .*\); one of them is damaged"),
])
def test_a_missing_or_damaged_tokenizer_file_is_one_line_naming_it_and_the_fix(tokenizer_folder, name, damage, error):
    path = tokenizer_folder / name
    if damage == "missing":
        path.unlink()
    else:
        path.write_text({"truncated": '{"version":\n', "empty": "", "another shape": "[1, 2]"}[damage])
    with pytest.raises(UserError, match=error.format(folder=tokenizer_folder)) as caught:
        tokenizer(tokenizer_folder)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("content, error", [
    (None, r"^{path} is missing: " + REBUILD),
    ('{"config": {"backend": ', r"^{path} is not JSON \(.*\): it is truncated or corrupt; " + REBUILD),
    ('{"program": "target.pte"}', r"^{path} holds no export config: it was written by another tool, or is damaged; "),
])
def test_a_missing_or_damaged_export_summary_is_one_line_naming_it_and_the_fix(tmp_path, content, error):
    path = tmp_path / "export.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ProgramError, match=error.format(path=path)) as caught:
        export_summary(tmp_path)
    assert "\n" not in str(caught.value)
    if content is not None:  # validate and bench ask which backend the programs need first
        with pytest.raises(ProgramError, match=error.format(path=path)):
            missing_backend(tmp_path)
    path.write_text(json.dumps({"config": {"backend": "portable"}}))
    assert export_summary(tmp_path)["config"] == {"backend": "portable"} and missing_backend(tmp_path) is None


def test_damaged_shared_weights_are_named_not_the_program_that_reads_them(shared_programs, tmp_path):
    """(Missing shared weights: tests/test_host.py.)"""
    broken = shutil.copytree(shared_programs, tmp_path / "programs")
    (broken / "shared.ptd").write_bytes((shared_programs / "shared.ptd").read_bytes()[:1000])
    error = rf"^{broken}/shared.ptd is not a readable weights file \(.*\): truncated or corrupt; " + REBUILD
    with pytest.raises(ProgramError, match=error) as caught:
        load_programs(broken)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_dflash_generate_names_a_damaged_tokenizer_file_in_its_one_error_line(programs, tmp_path, name):
    broken = shutil.copytree(programs, tmp_path / "programs")
    (broken / name).write_text('{"version":\n')
    r = subprocess.run([str(Path(sys.executable).parent / "dflash"), "generate", "--prompt", "hi", "--programs",
                        str(broken)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {broken}/{name} is not JSON (Expecting value: line 2 column 1 (char 12)): it is truncated or corrupt; "
        "rebuild it (`dvc repro package` for artifacts/programs, `dvc repro fetch_target` for the target) or pull it "
        "again (`dvc pull`)")
