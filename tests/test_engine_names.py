"""One list of engine names per command, from the engines registry: `--help` shows it, and a wrong
name is refused with the same list."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import run
from kvdoctor.engines import budget_engines, check_engines


@pytest.mark.parametrize("command, names", [("check", check_engines()), ("config", check_engines()),
                                            ("budget", [*budget_engines(), "all"])])
def test_help_lists_the_engines_the_command_takes(command, names, tmp_path):
    shown = run(command, "--help", env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if "--engine " in line]
    assert f"[{'|'.join(names)}]" in line
    target = tmp_path / "model"
    wrong = run(command, *([str(target)] if command == "budget" else []), "--engine", "nope",
                *(["--static"] if command == "check" else []))
    assert wrong.returncode == 2
    assert wrong.stderr.count("\n") == 1 and all(name in wrong.stderr for name in names)


def test_check_engines_and_budget_engines_differ_as_the_profiles_do():
    assert check_engines() == ["hf", "vllm", "sglang", "sglang-mlx", "mlx-lm"]
    assert budget_engines() == ["vllm", "sglang", "mlx-lm"]


def test_the_list_is_made_only_for_help():
    """Listing the engines imports every profile: the application itself imports none."""
    code = "import sys, kvdoctor.cli.app; print(sorted(m for m in sys.modules if m.endswith('.profile')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
