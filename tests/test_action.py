"""action.yml, the GitHub Action: its `run:` steps run here, in order, as a runner runs a composite
action's bash steps (`bash --noprofile --norc -eo pipefail`, the inputs as the environment the step
declares, each step's `$GITHUB_OUTPUT` read back for the next). The `uses:` steps are GitHub's own
(setup-python, upload-sarif) and are not run; the SARIF they would upload is validated against the
official SARIF 2.1.0 schema. kvdoctor is installed by the action's own step: the wheel built from this
checkout, found by pip through the machine's local package index (no network), into a fresh venv.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import jsonschema
import pytest
import yaml

from helpers import ROOT
from kvdoctor import __version__
from test_packaging import SOURCES

ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
SARIF_SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")

pytestmark = pytest.mark.skipif(not SOURCES, reason="no local package index (set KVDOCTOR_WHEELHOUSE)")


def test_the_action_declares_the_inputs_and_uploads_sarif():
    assert ACTION["runs"]["using"] == "composite"
    assert {"targets", "engine", "deploy", "fail-on"} <= set(ACTION["inputs"])
    uses = [step["uses"] for step in ACTION["runs"]["steps"] if "uses" in step]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    for step in ACTION["runs"]["steps"]:
        if "run" in step:  # inputs reach a script through its environment only
            assert step["shell"] == "bash" and "${{" not in step["run"], step["name"]


def _pip_environment(dist: Path) -> dict[str, str]:
    """pip's settings as environment variables: the local sources, and the folder with the wheel."""
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(dist)}
    pairs = iter(SOURCES)
    for flag in pairs:
        if flag == "--no-index":
            env["PIP_NO_INDEX"] = "1"
            continue
        value = next(pairs)
        key = {"--index-url": "PIP_INDEX_URL", "--extra-index-url": "PIP_EXTRA_INDEX_URL",
               "--find-links": "PIP_FIND_LINKS"}[flag]
        env[key] = f"{env[key]} {value}" if key in env else value
    return env


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> dict:
    """A runner's environment: a fresh venv first on PATH (the Python setup-python gives), pip pointed at
    the local index and the wheel, and a workspace with the demo models as `make demo` builds them."""
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    python = tmp_path_factory.mktemp("python")
    venv.create(python, with_pip=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PIP_")}
    env.update(_pip_environment(dist), PATH=f"{python / 'bin'}{os.pathsep}{os.environ['PATH']}")
    workspace = tmp_path_factory.mktemp("workspace")
    demo = workspace / "build" / "demo"
    source = ROOT / "fixtures" / "models" / "openai__gpt-oss-20b"
    for name in ("gpt-oss-20b", "gpt-oss-20b-broken"):  # the Makefile's demo target, step by step
        synth = subprocess.run([sys.executable, "-m", "kvdoctor.load.synth", str(source), str(demo / name), "3"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert synth.returncode == 0, synth.stderr
    shutil.copy(ROOT / "fixtures" / "demo" / "gpt-oss-20b-broken" / "config.json", demo / "gpt-oss-20b-broken")
    shutil.copy(ROOT / "fixtures" / "demo" / "vllm-too-long.yaml", workspace)
    return {"env": env, "workspace": workspace}


def run_action(runner: dict, tmp_path: Path, **given: str) -> tuple[dict[str, subprocess.CompletedProcess], dict]:
    """The action's run: steps in order, stopping at the first that fails (as a runner does); the
    completed processes by step name, and the outputs by step id."""
    inputs = {name: str(spec.get("default", "")) for name, spec in ACTION["inputs"].items()}
    unknown = set(given) - set(inputs)
    assert not unknown, unknown
    inputs.update(given)
    outputs: dict[str, dict[str, str]] = {}

    def expand(text: str) -> str:
        def value(match: re.Match) -> str:
            expr = match.group(1)
            if expr.startswith("inputs."):
                return inputs[expr.removeprefix("inputs.")]
            step, _, name = expr.removeprefix("steps.").partition(".outputs.")
            assert expr.startswith("steps.") and name, f"an expression this test does not evaluate: {expr}"
            return outputs.get(step, {}).get(name, "")
        return EXPRESSION.sub(value, text)

    done: dict[str, subprocess.CompletedProcess] = {}
    for i, step in enumerate(ACTION["runs"]["steps"]):
        if "run" not in step:
            continue
        script, out = tmp_path / f"step-{i}.sh", tmp_path / f"output-{i}"
        script.write_text(step["run"])
        out.write_text("")
        env = {**runner["env"], "GITHUB_OUTPUT": str(out), **{k: expand(str(v)) for k, v in step.get("env", {}).items()}}
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=runner["workspace"],
                              env=env, capture_output=True, text=True, timeout=600)
        done[step["name"]] = proc
        if "id" in step:
            outputs[step["id"]] = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
        if proc.returncode != 0:
            break
    return done, outputs


def _sarif(runner: dict, outputs: dict) -> dict:
    doc = json.loads((runner["workspace"] / outputs["check"]["sarif-file"]).read_text())
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(doc)
    return doc


def _found(doc: dict) -> set[tuple[str, str]]:
    return {(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"])
            for run in doc["runs"] for r in run["results"]}


def test_the_demo_models_fail_the_job_with_a_valid_sarif(runner, tmp_path):
    steps, outputs = run_action(runner, tmp_path, targets="build/demo/gpt-oss-20b\nbuild/demo/gpt-oss-20b-broken",
                                engine="hf", **{"fail-on": "error", "version": __version__})
    install, check, fail = (steps[name] for name in ("Install kvdoctor", "Check the models", "Fail on findings"))
    assert install.returncode == 0 and install.stdout.strip().endswith(__version__), install.stderr[-2000:]
    assert check.returncode == 0, check.stderr[-2000:]
    assert outputs["check"] == {"exit-code": "1", "sarif-file": "kvdoctor.sarif"}
    assert fail.returncode == 1  # the job fails through kvdoctor's exit code, after the upload
    assert ("CFG001", "build/demo/gpt-oss-20b-broken/config.json") in _found(_sarif(runner, outputs))


def test_a_deploy_file_engine_and_arguments_reach_the_check(runner, tmp_path):
    steps, outputs = run_action(runner, tmp_path, targets="build/demo/gpt-oss-20b", engine="vllm",
                                deploy="vllm-too-long.yaml", args="--static --select VLM002",
                                **{"fail-on": "warning", "sarif-file": "out/vllm.sarif"})
    (runner["workspace"] / "out").mkdir(exist_ok=True)
    assert outputs["check"]["exit-code"] == "2"  # out/ did not exist: kvdoctor says so, the job fails
    steps, outputs = run_action(runner, tmp_path, targets="build/demo/gpt-oss-20b", engine="vllm",
                                deploy="vllm-too-long.yaml", args="--static --select VLM002",
                                **{"fail-on": "warning", "sarif-file": "out/vllm.sarif"})
    assert outputs["check"] == {"exit-code": "1", "sarif-file": "out/vllm.sarif"}, steps["Check the models"].stderr
    assert _found(_sarif(runner, outputs)) == {("VLM002", "vllm-too-long.yaml")}
    assert steps["Fail on findings"].returncode == 1


def test_a_target_is_never_run_as_shell_code(runner, tmp_path):
    steps, outputs = run_action(runner, tmp_path, targets='build/demo/gpt-oss-20b;touch pwned $(touch pwned2)')
    assert not (runner["workspace"] / "pwned").exists() and not (runner["workspace"] / "pwned2").exists()
    assert outputs["check"]["exit-code"] == "2"  # the odd names are targets that do not exist
    assert "no such model directory" in steps["Check the models"].stderr
    _sarif(runner, outputs)  # still a valid log: the healthy model, and the targets that could not be read
    assert steps["Fail on findings"].returncode == 2
