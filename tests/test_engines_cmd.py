"""`kvdoctor engines list` and `kvdoctor engines install`, and ENG065: an engine Python that cannot run
the dry run is named with the fix, never reported as an unknown engine error (ENG051). Nothing here
downloads: `install --print` shows the commands, and the venvs are made with `python -m venv`."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import venv
from importlib import metadata

import pytest

from helpers import make_model, run
from kvdoctor.engines.base import Plan
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.venvs import RECIPES, TORCH, dist_name
from kvdoctor.engines.vllm.dryrun import record

PLAN = Plan(engine="vllm", versions={}, layers=())  # what the child said is read without a plan to hold it to


def _env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KVDOCTOR_VLLM_PYTHON", "KVDOCTOR_SGLANG_PYTHON")}
    return {**env, "KVDOCTOR_ENGINE_VENVS": str(tmp_path / "venvs"), **extra}


def test_install_prints_the_recipe_for_the_pinned_release(tmp_path):
    shown = run("engines", "install", "vllm", "--print", env=_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    python = tmp_path / "venvs" / "vllm" / "bin" / "python"
    assert lines[0] == f"{sys.executable} -m venv {tmp_path / 'venvs' / 'vllm'}"
    assert lines[1] == f"{python} -m pip install -q {TORCH}"
    assert lines[2] == f"{python} -m pip install -q --no-deps vllm=={PINS['vllm']}"
    assert lines[3].startswith(f"{python} -m pip install -q packaging numpy") and len(lines) == 4
    assert not (tmp_path / "venvs").exists()  # printed, not run


def test_install_takes_a_version_and_a_torch_index(tmp_path):
    shown = run("engines", "install", "sglang", "--version", "0.5.22", "--torch-index",
                "https://download.pytorch.org/whl/cpu", "--print", env=_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1].endswith(f"{TORCH} --index-url https://download.pytorch.org/whl/cpu")
    assert "--no-deps sglang==0.5.22 triton==3.7.1" in lines[2] and "orjson" in lines[3]


def test_install_takes_the_release_as_engine_takes_it(tmp_path):
    shown = run("engines", "install", "vllm==0.30.0", "--print", env=_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "--no-deps vllm==0.30.0" in shown.stdout.splitlines()[2]


def test_sglang_mlx_installs_into_kvdoctors_own_python(tmp_path):
    shown = run("engines", "install", "sglang-mlx", "--print", env=_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert all(line.startswith(f"{sys.executable} -m pip install") for line in shown.stdout.splitlines())
    assert f"--no-deps sglang=={PINS['sglang']}" in shown.stdout and f"mlx-lm=={PINS['mlx-lm']}" in shown.stdout


@pytest.mark.parametrize("args, says", [
    (["nope"], "unknown engine 'nope'; expected one of: vllm, sglang, sglang-mlx"),
    (["hf"], "unknown engine 'hf'"),
    (["vllm", "--version", "0.33;rm"], "--version '0.33;rm': expected a release"),
    (["vllm==0.30.0", "--version", "0.31.0"], "ENGINE vllm==0.30.0 and --version 0.31.0 name two releases"),
    (["vllm=="], "ENGINE 'vllm==': expected ENGINE or ENGINE==RELEASE"),
    ([], "missing argument ENGINE")])
def test_install_refuses_bad_arguments_in_one_line(tmp_path, args, says):
    proc = run("engines", "install", *args, "--print", env=_env(tmp_path))
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert says in line, line


def test_list_shows_a_real_venv_and_what_it_lacks(tmp_path):
    venv.create(tmp_path / "venvs" / "vllm", with_pip=False)  # a real Python without vLLM
    listed = run("engines", "list", "--format", "json", env=_env(tmp_path, KVDOCTOR_SGLANG_PYTHON=sys.executable))
    assert listed.returncode == 0, listed.stderr
    rows = {row["engine"]: row for row in json.loads(listed.stdout)}
    assert list(rows) == ["hf", "vllm", "sglang", "sglang-mlx", "mlx-lm"]
    assert rows["hf"]["dry_run"] is None
    vllm = rows["vllm"]
    assert vllm["python"] == str(tmp_path / "venvs" / "vllm" / "bin" / "python")
    assert vllm["found_by"] == str(tmp_path / "venvs") and not vllm["ready"]
    assert vllm["versions"]["vllm"] is None and "vllm" in vllm["missing"]
    sglang = rows["sglang"]  # this very Python, named by the variable: what it holds, read here too
    assert sglang["python"] == sys.executable and sglang["found_by"] == "$KVDOCTOR_SGLANG_PYTHON"
    recipe = RECIPES["sglang"]
    for dist in [recipe.dist, dist_name(TORCH), *map(dist_name, recipe.requires)]:
        try:
            have: str | None = metadata.version(dist)
        except metadata.PackageNotFoundError:
            have = None
        assert sglang["versions"][dist] == have, dist
    assert sglang["ready"] == (not sglang["missing"])
    text = run("engines", "list", env=_env(tmp_path)).stdout
    assert f"vllm        {tmp_path / 'venvs' / 'vllm' / 'bin' / 'python'}" in text
    assert "no vllm; dry run not ready: missing vllm" in text and "kvdoctor engines install vllm" in text


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def test_list_says_the_mlx_lm_dry_run_runs_in_kvdoctors_own_python_with_the_mlx_extra(tmp_path):
    """`check --engine mlx-lm --dry-run` runs its child in kvdoctor's own Python once kvdoctor[mlx] is in."""
    listed = run("engines", "list", "--format", "json", env=_env(tmp_path))
    assert listed.returncode == 0, listed.stderr
    row = {r["engine"]: r for r in json.loads(listed.stdout)}["mlx-lm"]
    assert row["dry_run"] == "kvdoctor's Python" and row["python"] == sys.executable
    assert row["found_by"] == "kvdoctor's own Python" and row["install"] == "pip install 'kvdoctor[mlx]'"
    assert row["versions"] == {"mlx-lm": _installed("mlx-lm"), "mlx": _installed("mlx")}
    assert row["describes"] == PINS["mlx-lm"] and row["ready"] == all(row["versions"].values())
    line = next(l for l in run("engines", "list", env=_env(tmp_path)).stdout.splitlines() if l.startswith("mlx-lm "))
    assert "no dry run" not in line and f"{sys.executable} (kvdoctor's own Python)" in line
    assert ("dry run ready" in line) == row["ready"]
    assert row["ready"] or "pip install 'kvdoctor[mlx]'" in line


def _dry_run_codes(tmp_path, engine: str, python: str) -> list[dict]:
    model = make_model(tmp_path, "qwen2.5-7b", checkpoint=False)
    proc = run("check", str(model), "--engine", engine, "--dry-run", "--engine-python", python, "--format", "json",
               env=_env(tmp_path))
    assert proc.returncode in (0, 1), proc.stderr
    return [f for f in json.loads(proc.stdout)["results"][0]["findings"] if f["code"].startswith("ENG")]


def test_a_python_without_the_engine_is_eng065_not_an_unknown_engine_error(tmp_path):
    python = tmp_path / "bare"
    venv.create(python, with_pip=False)
    [finding] = _dry_run_codes(tmp_path, "vllm", str(python / "bin" / "python"))
    assert finding["code"] == "ENG065" and finding["severity"] == "warning"
    assert f"{python / 'bin' / 'python'} has no vllm" in finding["message"]
    assert "kvdoctor engines install vllm" in finding["message"] and "pip install vllm" not in finding["message"]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None or importlib.util.find_spec("orjson") is not None,
                    reason="needs this Python to hold sglang (--no-deps) without orjson, as `make venv` leaves it")
def test_an_engine_missing_a_requirement_names_the_module_and_the_fix(tmp_path):
    [finding] = _dry_run_codes(tmp_path, "sglang", sys.executable)
    assert finding["code"] == "ENG065" and finding["evidence"]["missing_module"] == "orjson"
    assert f"{sys.executable} -m pip install orjson" in finding["message"]
    assert "kvdoctor engines install sglang" in finding["message"]


def test_an_engine_error_that_is_not_the_environment_stays_the_engines():
    from helpers import REAL
    from kvdoctor.checks.dryrun_child import environment_finding
    from kvdoctor.load.loader import load_model

    spec = load_model(str(REAL / "Qwen__Qwen2.5-7B-Instruct"), with_checkpoint=False)
    refused = {"versions": {"vllm": PINS["vllm"]}, "returncode": 0,
               "outcome": {"start": False, "class": "ValueError", "message": "max_model_len is too large",
                           "stage": "config"}}
    assert environment_finding(record(PLAN, refused), spec) is None
    died = {"returncode": 1, "stderr_tail": "Traceback ...\nImportError: cannot import name 'x' from 'vllm.y'"}
    found = environment_finding(record(PLAN, died), spec)
    assert found is not None and found.code == "ENG065" and "cannot import name 'x'" in found.message


def test_only_the_exception_the_child_died_of_counts():
    """vLLM logs the optional imports it misses (`Failed to import from vllm._C: ModuleNotFoundError(...)`);
    a child that then dies of something else is not an environment problem."""
    from helpers import REAL
    from kvdoctor.checks.dryrun_child import environment_finding
    from kvdoctor.load.loader import load_model

    spec = load_model(str(REAL / "Qwen__Qwen2.5-7B-Instruct"), with_checkpoint=False)
    tail = ("ModuleNotFoundError: No module named 'vllm._C'\nTraceback (most recent call last):\n"
            "RuntimeError: something else\n")
    assert environment_finding(record(PLAN, {"returncode": 1, "versions": {"vllm": "0.33.0"}, "stderr_tail": tail}),
                               spec) is None
