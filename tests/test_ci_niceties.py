"""CI conveniences: the GitHub job summary, `targets` in the config file, and the pre-commit hooks
run as pre-commit runs them (their `entry` plus the user's `args`)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, make_model, run


def _broken(cfg: dict) -> None:
    cfg["layer_types"] = cfg["layer_types"][:-1]


@pytest.fixture()
def models(tmp_path) -> Path:
    make_model(tmp_path / "models", "gpt-oss-20b", checkpoint=False, dirname="healthy")
    make_model(tmp_path / "models", "gpt-oss-20b", edit=_broken, checkpoint=False, dirname="broken")
    return tmp_path / "models"


def test_github_format_writes_a_markdown_job_summary(models, tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    proc = run("check", "--static", str(models), "--format", "github", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert proc.returncode == 1, proc.stderr
    text = summary.read_text()
    assert text.startswith("earlier step\n## kvdoctor\n")  # appended, as GitHub expects of each step
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1].rsplit("/", 1)[-1] for row in rows] == ["broken", "healthy"]
    assert rows[0].split("|")[3].strip() == "1"  # one error for the broken copy
    assert "| **CFG001** layer-types-length-mismatch | error |" in text
    assert proc.stdout.splitlines()[-1].startswith("kvdoctor: 2 model(s)")  # stdout: the annotations as before


def test_no_job_summary_without_the_variable_or_in_other_formats(models, tmp_path):
    summary = tmp_path / "summary.md"
    env = {"GITHUB_STEP_SUMMARY": ""}
    assert run("check", "--static", str(models), "--format", "github", env=env).returncode == 1
    assert run("check", "--static", str(models), "--format", "concise",
               env={"GITHUB_STEP_SUMMARY": str(summary)}).returncode == 1
    assert not summary.exists()


def test_config_file_targets_are_checked_when_none_are_given(models, tmp_path):
    (tmp_path / "kvdoctor.toml").write_text('targets = ["models/broken"]\n')
    sub = tmp_path / "deeper"
    sub.mkdir()
    proc = run("check", "--static", "--format", "json", cwd=sub)  # found from a subfolder, relative to the file
    assert proc.returncode == 1, proc.stderr
    assert [Path(r["target"]).name for r in json.loads(proc.stdout)["results"]] == ["broken"]
    named = run("check", "--static", "--format", "json", str(models / "healthy"), cwd=sub)
    assert [Path(r["target"]).name for r in json.loads(named.stdout)["results"]] == ["healthy"]  # the command line wins
    shown = json.loads(run("config", "--format", "json", cwd=sub).stdout)
    assert shown["targets"]["value"] == ["../models/broken"] and shown["targets"]["from"].endswith("kvdoctor.toml:1")


def test_no_targets_anywhere_is_one_line_and_exit_2(tmp_path):
    proc = run("check", "--isolated", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no models to check" in proc.stderr


def test_bad_targets_value_names_the_file(tmp_path):
    (tmp_path / "kvdoctor.toml").write_text('targets = "models"\n')
    proc = run("check", cwd=tmp_path)
    assert proc.returncode == 2 and "kvdoctor.toml:1: setting 'targets'" in proc.stderr


HOOKS = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def _hook(hook_id: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The hook's command as pre-commit builds it: entry, then args (no file names: pass_filenames is false)."""
    entry = shlex.split(HOOKS[hook_id]["entry"])
    assert entry[0] == "kvdoctor"
    return subprocess.run([sys.executable, "-m", "kvdoctor", *entry[1:], *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_pre_commit_static_hook_fails_on_the_broken_model_and_passes_on_the_healthy(models, tmp_path):
    hook = HOOKS["kvdoctor-static"]
    assert hook["pass_filenames"] is False and hook["language"] == "python"
    files = re.compile(hook["files"])
    assert files.search("models/healthy/config.json") and files.search("deploy-prod.yaml")
    assert not files.search("README.md") and not files.search("model.safetensors")
    failed = _hook("kvdoctor-static", [str(models)], tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert re.search(r"broken/config\.json:\d+: CFG001 \[error\]", failed.stdout)
    passed = _hook("kvdoctor-static", [str(models / "healthy")], tmp_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_pre_commit_full_hook_runs_the_probes(models, tmp_path):
    proc = _hook("kvdoctor", [str(models / "broken"), "--engine", "sglang-mlx"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "CFG001 [error]" in proc.stdout and "ENG009" in proc.stdout  # ENG009 comes from a probe
