"""`--engine vllm --dry-run`: a vLLM release's own start-up in a child process, against the static plan.

Needs a Python with a profiled vLLM release (goldens/.venv/vllm, or $KVDOCTOR_VLLM_PYTHON); without one only the
'unavailable' path is tested. The per-release test runs each release whose venv goldens/releases.py built
(goldens/.venv/vllm-<release>). Each run takes tens of seconds on two cores.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from helpers import masked
from kvdoctor.engines import child
from kvdoctor.engines.pins import PROFILED
from kvdoctor.checks import dryrun_vllm
from kvdoctor.catalog.matcher import code_for
from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.releases import at
from kvdoctor.engines.vllm import dryrun, releases
from kvdoctor.engines.vllm.profile import plan
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.load.loader import load_model
from test_vllm_findings import MODELS, spec_of

PYTHON = child.find_python(None, dryrun.ENV_PYTHON, "vllm")
TIMING = {"seconds", "stderr_tail"}  # what differs between two runs of one model
ROOT = Path(__file__).resolve().parent.parent
needs_vllm = pytest.mark.skipif(PYTHON is None, reason="no Python with vLLM (set KVDOCTOR_VLLM_PYTHON)")


def test_engine_args_carry_only_what_is_set():
    assert dryrun.engine_args(VllmSettings()) == {}
    args = dryrun.engine_args(VllmSettings(tensor_parallel_size=8, kv_cache_dtype="fp8", kv_budget="4GiB",
                                           disable_hybrid_kv_cache_manager=True))
    assert args == {"tensor_parallel_size": 8, "kv_cache_dtype": "fp8", "disable_hybrid_kv_cache_manager": True}


def test_without_vllm_one_finding_and_the_static_plan_stands(tmp_path):
    spec = load_model(str(MODELS / "google__gemma-3-1b-it"), library_check=False)
    record = dryrun.VllmDryRunner().run(spec, VllmSettings(), plan(spec, VllmSettings()),
                                        {"engine_python": str(tmp_path / "missing-python")})
    if PYTHON is None:
        assert not record.ran and record.to_json()["reason"].startswith(f"no Python with vLLM {dryrun.VERSION} found")
        (finding,) = dryrun_vllm.findings(spec, plan(spec, VllmSettings()), record, builtin_catalog())
        assert finding.code == "ENG050" and "static vLLM checks still ran" in finding.message
    assert child.find_python(str(tmp_path / "missing-python"), dryrun.ENV_PYTHON, "vllm") in (None, PYTHON)


@needs_vllm
def test_dry_run_agrees_with_the_plan_and_confirms_a_predicted_refusal():
    spec = load_model(str(MODELS / "google__gemma-3-1b-it"), library_check=False)
    healthy = dryrun.launch(spec, VllmSettings(), PYTHON, timeout=600)
    assert healthy["outcome"]["start"] and healthy["versions"]["vllm"] == dryrun.VERSION  # the pinned release
    assert dryrun_vllm.findings(spec, plan(spec, VllmSettings()), dryrun.record(plan(spec, VllmSettings()), healthy),
                                builtin_catalog()) == []
    long = VllmSettings(max_model_len=65536)
    refused = dryrun.launch(spec, long, PYTHON, timeout=600)
    assert refused["outcome"]["class"] == "ValidationError"
    assert code_for(builtin_catalog(), "vllm", "ValidationError", refused["outcome"]["message"]) == "VLM002"
    # predicted: no duplicate
    assert dryrun_vllm.findings(spec, plan(spec, long), dryrun.record(plan(spec, long), refused), builtin_catalog()) == []


@needs_vllm
def test_a_stale_plan_is_reported(tmp_path):
    """Feed the comparison a plan made for other settings: the engine's answer wins, as VLM030."""
    cfg = json.loads((MODELS / "google__gemma-3-1b-it" / "config.json").read_text())
    spec = spec_of(tmp_path, copy.deepcopy(cfg))
    result = dryrun.launch(spec, VllmSettings(), PYTHON, timeout=600)
    stale = plan(spec, VllmSettings(max_model_len=65536))  # refuses, where vLLM started
    codes = [f.code for f in dryrun_vllm.findings(spec, stale, dryrun.record(stale, result), builtin_catalog())]
    assert codes == ["VLM030"]


@needs_vllm
def test_the_warm_child_gives_the_one_shot_result(monkeypatch):
    """Two model families through one warm child (vLLM imported once, a fork per model): each result
    is the one a fresh one-shot child gives."""
    from kvdoctor.engines import warm

    specs = [load_model(str(MODELS / name), library_check=False)
             for name in ("google__gemma-3-1b-it", "Qwen__Qwen2.5-7B-Instruct")]
    with monkeypatch.context() as patch:
        patch.setattr(warm, "available", lambda: False)
        fresh = [dryrun.launch(spec, VllmSettings(), PYTHON, timeout=600) for spec in specs]
    kind = str(dryrun.CHILD)
    warm.drop(kind)
    served = []
    for spec, want in zip(specs, fresh):
        got = dryrun.launch(spec, VllmSettings(), PYTHON, timeout=600)
        served.append(warm.pid_of(kind))
        assert got["returncode"] == 0 and got["outcome"]["start"], got["stderr_tail"]
        assert masked(got, TIMING) == masked(want, TIMING), spec.model_dir.name
    assert len(set(served)) == 1 and served[0] is not None
    warm.drop(kind)


@needs_vllm
def test_a_bare_assert_the_plan_predicted_is_not_reported_twice(tmp_path):
    """phi-4 at TP 8: llama.py's attention asserts on its 10 KV heads with no message (VLM142); no catalog
    pattern can match an empty text, so the dry run confirms the prediction by class and text."""
    from test_vllm_findings import config

    spec = spec_of(tmp_path, config("microsoft__phi-4"))
    settings = VllmSettings(tensor_parallel_size=8)
    result = dryrun.launch(spec, settings, PYTHON, timeout=600)
    assert (result["outcome"]["class"], result["outcome"]["message"]) == ("AssertionError", "")
    assert [r.code for r in plan(spec, settings).refusals] == ["VLM142"]
    assert dryrun_vllm.findings(spec, plan(spec, settings), dryrun.record(plan(spec, settings), result),
                                builtin_catalog()) == []
    assert [f.code for f in dryrun_vllm.findings(
        spec, plan(spec, VllmSettings()), dryrun.record(plan(spec, VllmSettings()), result), builtin_catalog())] == [
        "ENG051", "VLM030"]  # a plan made for TP 1 did not foresee it


RELEASE_VENVS = {release: ROOT / "goldens" / ".venv" / f"vllm-{release}" / "bin" / "python"
                 for release in PROFILED["vllm"]}


@pytest.mark.parametrize("release", RELEASE_VENVS)
def test_the_dry_run_adapts_to_each_release(release, tmp_path):
    """The child harness on a release's own API (kv_cache_utils before 0.33.0, kv_cache_planning after; 0.26.0
    resolves its CPU platform only as a CPU build):
    Gemma-3 starts as the plan at that release says; Qwen3-Next with the hybrid manager off is refused by the
    release's grouping code, at that release's own line."""
    python = RELEASE_VENVS[release]
    if not python.exists():
        pytest.skip(f"no vLLM {release} venv (python goldens/releases.py --venv-only vllm=={release})")
    gemma = load_model(str(MODELS / "google__gemma-3-1b-it"), library_check=False)
    settings = VllmSettings().at_release(release)
    result = dryrun.launch(gemma, settings, python, timeout=600)
    assert result["versions"]["vllm"] == release  # the release the plan describes: no ENG110 below
    assert result["outcome"]["start"], result["stderr_tail"]
    static = plan(gemma, settings)
    assert dryrun_vllm.findings(gemma, static, dryrun.record(static, result), builtin_catalog()) == []
    hybrid = load_model(str(MODELS / "Qwen__Qwen3-Next-80B-A3B-Instruct"), library_check=False)
    off = VllmSettings(disable_hybrid_kv_cache_manager=True).at_release(release)
    refused = dryrun.launch(hybrid, off, python, timeout=600)
    assert refused["outcome"]["stage"] == "groups"
    assert refused["outcome"]["message"] == at(releases.PROMOTION_FAILED, release)  # each release's wording
    file, line = refused["outcome"]["raised_at_vllm"].split(" in ")[0].rsplit(":", 1)
    assert plan(hybrid, off).refusals[0].source.endswith(f"{file}#L{line}")  # the release's own line
