"""`dflash`: every user command is one of its subcommands, listed by `dflash --help`, each with help that says what
it costs; a command run away from the project's root is refused in one line."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_et import cli

DFLASH = str(Path(sys.executable).parent / "dflash")
USER_COMMANDS = ("generate", "serve", "train-draft", "compare", "profile")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [commands] = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_dflash_help_lists_every_user_command():
    assert tuple(subcommands()) == USER_COMMANDS
    r = subprocess.run([DFLASH, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    listed = [m.group(1) for line in r.stdout.splitlines() if (m := re.match(r" {4}(\S+)", line))]
    assert listed == list(USER_COMMANDS), r.stdout


@pytest.mark.parametrize("name", USER_COMMANDS)
def test_each_commands_help_says_what_it_costs(name):
    text = subcommands()[name].format_help()
    assert "Costs:" in text and f"usage: dflash {name}" in text


@pytest.mark.parametrize("argv", [["train-draft", "builtin", "out"], ["compare", "out"]])
def test_a_command_that_reads_params_yaml_away_from_the_root_is_one_line(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert str(e.value) == (f"error: no params.yaml in {tmp_path}; run this from the project's root "
                            "(where dvc.yaml is)")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn"])
def test_serve_without_the_serve_extra_is_one_line_naming_the_install(missing, tmp_path):
    """An environment without one of the serve extra's packages: `dflash serve` says which and how to install it,
    in one line, before any worker starts."""
    code = (f"import sys; sys.modules[{missing!r}] = None; from dflash_et import cli; "
            f"cli.main(['serve', '--programs', {str(tmp_path)!r}])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (f"error: dflash serve needs {missing}, which this environment "
                                                 "lacks; install the serve extra: pip install -e '.[serve]'")
