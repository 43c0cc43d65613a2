"""The dry-run record every engine gives (`engines.base.DryRun`) and the one rule that reads it
(`checks.dryrun_engine`): the same outcome, stages, error and differences for vLLM and SGLang, one
ENG051 when the child dies, no duplicate of a refusal the plan foresaw, and a record in every format
even when the engine is not installed.

The child results fed to `record` below have the shape the children write (engines/vllm/startup.py,
engines/sglang/startup.py); the runs that produce them need the engines' Pythons (tests/test_vllm_dryrun.py
and tests/test_sglang_dryrun.py run them where they exist)."""
from __future__ import annotations

import json

import msgspec
import pytest

from helpers import make_model, run
from test_json_schema import errors as schema_errors
from kvdoctor.catalog import builtin_catalog
from kvdoctor.catalog.matcher import code_for
from kvdoctor.checks import dryrun_sglang, dryrun_vllm
from kvdoctor.engines import child, profile
from kvdoctor.engines.base import Refusal
from kvdoctor.engines.sglang import dryrun as sglang_dryrun
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.engines.vllm import dryrun as vllm_dryrun
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.load.loader import load_model

VLLM_PYTHON = child.find_python(None, vllm_dryrun.ENV_PYTHON, "vllm")
SGLANG_PYTHON = child.find_python(None, sglang_dryrun.ENV_PYTHON, "sglang")
LONG = ("The model's max seq len ({n}) is larger than the maximum number of tokens that can be stored in KV cache")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    spec = load_model(str(make_model(tmp_path_factory.mktemp("m"), "gemma-3-1b-it", checkpoint=False)),
                      library_check=False)
    return spec, profile("vllm").plan(spec, VllmSettings())


def test_a_vllm_start_is_clean_with_every_stage_done(gemma):
    spec, plan = gemma
    rows = [{"index": l.index, "spec": l.extra["engine_spec"], "window": l.engine_window} for l in plan.layers]
    record = vllm_dryrun.record(plan, {"versions": {"vllm": "0.34.0"}, "outcome": {"start": True}, "layers": rows,
                                       "seconds": 31.5})
    assert (record.outcome, record.error, list(record.differences)) == ("clean", None, [])
    assert record.stages == {"config": "ok", "specs": "ok", "groups": "ok", "admission": "ok"}
    assert record.summary() == ("dry run (vllm 0.34.0): clean in 31.5 s; stages done: config, specs, groups, admission; "
                                "agrees with the plan on start-up outcome, per-layer specs and windows, KV cache groups")
    assert dryrun_vllm.findings(spec, plan, record, builtin_catalog()) == []


def test_a_dry_run_of_another_release_says_so_and_the_same_release_stays_quiet(gemma):
    spec, plan = gemma
    assert plan.versions["vllm"] == "0.34.0"  # the default release, none named
    rows = [{"index": l.index, "spec": l.extra["engine_spec"], "window": l.engine_window} for l in plan.layers]
    older = vllm_dryrun.record(plan, {"versions": {"vllm": "0.31.0"}, "outcome": {"start": True}, "layers": rows})
    (finding,) = dryrun_vllm.findings(spec, plan, older, builtin_catalog())
    assert finding.code == "ENG110" and finding.evidence["ran"] == "0.31.0" and finding.evidence["described"] == "0.34.0"
    local = vllm_dryrun.record(plan, {"versions": {"vllm": "0.34.0+cpu"}, "outcome": {"start": True}, "layers": rows})
    assert dryrun_vllm.findings(spec, plan, local, builtin_catalog()) == []  # a local build's suffix is the release


def test_a_layer_the_engine_built_otherwise_is_a_difference(gemma):
    spec, plan = gemma
    rows = [{"index": l.index, "spec": "FullAttentionSpec", "window": None} for l in plan.layers]
    record = vllm_dryrun.record(plan, {"versions": {"vllm": "0.34.0"}, "outcome": {"start": True}, "layers": rows})
    sliding = sum(1 for l in plan.layers if l.engine_window)
    assert len(record.differences) == sliding > 0
    (finding,) = dryrun_vllm.findings(spec, plan, record, builtin_catalog())
    assert finding.code == "VLM030" and finding.evidence["differences"] == list(record.differences)
    assert "difference(s) from the plan" in record.summary()


def test_an_error_the_plan_did_not_foresee_gets_its_catalog_code_once(gemma):
    spec, plan = gemma
    message = LONG.format(n=1048576) + " (100). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
    error = {"start": False, "stage": "admission", "class": "ValueError", "message": message,
             "raised_at_vllm": "vllm/v1/core/kv_cache_utils.py:700 in check_enough_kv_cache_memory"}
    record = vllm_dryrun.record(plan, {"versions": {"vllm": "0.34.0"}, "outcome": error, "layers": []})
    assert record.outcome == "error" and record.error.frame.startswith("vllm/v1/core/kv_cache_utils.py:700")
    assert record.stages == {"config": "ok", "specs": "ok", "groups": "ok", "admission": "error"}
    refusal, differs = dryrun_vllm.findings(spec, plan, record, builtin_catalog())
    assert differs.code == "VLM030" and "static plan: start; vLLM: ValueError" in differs.message
    assert refusal.code == code_for(builtin_catalog(), "vllm", "ValueError", message) != "ENG051"
    assert refusal.engine_error["message"] == message and refusal.evidence["stage"] == "admission"
    # the same error, foreseen by the plan, is its refusal rule's to report
    foreseen = msgspec.structs.replace(plan, refusals=(Refusal(refusal.code, "ValueError", message, "startup"),))
    again = vllm_dryrun.record(foreseen, {"versions": {"vllm": "0.34.0"}, "outcome": error, "layers": []})
    assert dryrun_vllm.findings(spec, foreseen, again, builtin_catalog()) == []


@pytest.mark.parametrize("result, outcome, reason", [
    ({"timed_out": True, "returncode": None, "stderr_tail": "importing torch"}, "timeout", "timed out"),
    ({"timed_out": False, "returncode": -9, "stderr_tail": "Killed", "versions": {"vllm": "0.33.0", "sglang": "0.5.23"}},
     "crashed", "exited with -9"),
])
def test_a_child_that_dies_is_one_eng051_for_every_engine(gemma, result, outcome, reason):
    spec, plan = gemma
    for record, rule in ((vllm_dryrun.record(plan, result), dryrun_vllm.findings),
                         (sglang_dryrun.record(plan, result), dryrun_sglang.findings)):
        assert (record.outcome, record.reason) == (outcome, reason)
        assert "ok" not in record.stages.values()
        (finding,) = rule(spec, plan, record, builtin_catalog())
        assert finding.code == "ENG051" and f"the child {reason} before" in finding.message
        assert result["stderr_tail"] in finding.message


def test_an_sglang_refusal_names_its_step(gemma):
    spec, _ = gemma
    plan = profile("sglang").plan(spec, SglangSettings())
    outcome = {"start": False, "step": "model_config", "class": "ValueError", "message": "no such thing",
               "raised_at_sglang": "sglang/srt/configs/model_config.py:1 in __init__"}
    record = sglang_dryrun.record(plan, {"versions": {"sglang": "0.5.23"}, "stages": ["server_args"],
                                         "outcome": outcome})
    assert record.stages["server_args"] == "ok" and record.stages["model_config"] == "error"
    assert record.stages["sizing"] == "not run"
    codes = [f.code for f in dryrun_sglang.findings(spec, plan, record, builtin_catalog())]
    assert codes[0] == "ENG051" and "SGL050" in codes  # unknown text; the plan said it starts


@pytest.mark.parametrize("engine, python", [("vllm", VLLM_PYTHON), ("sglang", SGLANG_PYTHON)])
def test_a_dry_run_leaves_its_record_in_every_format_even_when_it_cannot_run(tmp_path, engine, python):
    if python is not None:
        pytest.skip(f"a Python with {engine} is installed here: the dry run would run")
    model = make_model(tmp_path, "gemma-3-1b-it", checkpoint=False)
    missing = str(tmp_path / "no-python")
    plain = run("check", str(model), "--engine", engine, "--format", "json")
    proc = run("check", str(model), "--engine", engine, "--format", "json", "--dry-run", "--engine-python", missing)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    record = doc["results"][0]["info"]["dry_run"]
    assert record == {"engine": engine, "ran": False, "outcome": "unavailable", "reason": record["reason"]}
    assert "no Python with" in record["reason"]
    assert "dry_run" not in json.loads(plain.stdout)["results"][0]["info"]
    assert schema_errors(doc) == []
    text = run("check", str(model), "--engine", engine, "--dry-run", "--engine-python", missing).stdout
    assert f"dry run ({engine}): not run: no Python with" in " ".join(text.split())
    html = tmp_path / "r.html"
    run("check", str(model), "--engine", engine, "--dry-run", "--engine-python", missing, "--html-output", str(html))
    assert "<h3>Dry run</h3>" in html.read_text()
