"""Shell completion: `kvdoctor --show-completion` prints a script that completes kvdoctor's commands and
options in bash, and `--install-completion` writes it under $HOME (a temporary one here: the user's
shell files are never touched)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT


@pytest.fixture
def shell(tmp_path) -> dict[str, str]:
    """bash's environment: a temporary $HOME, and `kvdoctor` on PATH (this checkout's, as the console
    script runs it)."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    launcher = bin_dir / "kvdoctor"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kvdoctor "$@"\n')
    launcher.chmod(0o755)
    return {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT), "SHELL": "/bin/bash"}


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `script` in bash, which stays kvdoctor's parent (a last command would be exec'd in its place):
    typer finds the user's shell among kvdoctor's parent processes, as it does in a terminal."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", f"{script}\nexit $?"], capture_output=True,
                          text=True, env=env, timeout=120)


def test_the_script_completes_commands_and_options_in_bash(shell):
    shown = bash("kvdoctor --show-completion", shell)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _kvdoctor_completion kvdoctor" in shown.stdout
    completed = bash('source <(kvdoctor --show-completion)\n'
                     'COMP_WORDS=(kvdoctor ch); COMP_CWORD=1; _kvdoctor_completion kvdoctor; echo "${COMPREPLY[*]}"\n'
                     'COMP_WORDS=(kvdoctor check --fail); COMP_CWORD=2; _kvdoctor_completion kvdoctor; '
                     'echo "${COMPREPLY[*]}"\n', shell)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["check", "--fail-on"]
    assert list(Path(shell["HOME"]).iterdir()) == []  # showing it writes nothing


def test_install_writes_only_under_home(shell):
    shown = bash("kvdoctor --show-completion", shell).stdout
    installed = bash("kvdoctor --install-completion", shell)
    assert installed.returncode == 0, installed.stderr
    home = Path(shell["HOME"])
    script = home / ".bash_completions" / "kvdoctor.sh"
    assert script.read_text().strip() == shown.strip()
    assert f"source '{script}'" in (home / ".bashrc").read_text()
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [
        ".bash_completions", ".bash_completions/kvdoctor.sh", ".bashrc"]
