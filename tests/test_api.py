"""`kvdoctor.api`, called in-process: the records it returns are the ones the command line reports."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import make_model, run
from kvdoctor import api
from kvdoctor.errors import InputError
from kvdoctor.model import Result
from kvdoctor.report import result_json
from kvdoctor.report.jsontext import indented


def _short(cfg: dict) -> None:
    cfg["layer_types"] = cfg["layer_types"][:-1]  # CFG001


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("api")
    make_model(root, "gemma-2-2b", checkpoint=False, dirname="a-healthy")
    make_model(root, "gpt-oss-20b", checkpoint=False, edit=_short, dirname="b-broken")
    return root


def test_check_returns_the_results_the_json_report_lists(models):
    results = api.check(models, engine="sglang-mlx", static=True)  # a folder of models, as on the command line
    assert [Path(r.target).name for r in results] == ["a-healthy", "b-broken"]
    assert all(isinstance(r, Result) for r in results)
    assert "CFG001" in [f.code for f in results[1].findings] and results[1].findings[0].severity == "error"
    doc = json.loads(run("check", str(models), "--engine", "sglang-mlx", "--static", "--format", "json").stdout)
    as_json = [json.loads(indented(result_json(r))) for r in results]  # JSON's types: lists, string keys
    assert as_json == [{k: v for k, v in entry.items() if k != "checked"} | {
        "findings": [{k: v for k, v in f.items() if k != "fingerprint"} for f in entry["findings"]]}
        for entry in doc["results"]]


def test_check_selects_and_ignores_like_the_command_line(models):
    broken = str(models / "b-broken")
    assert [f.code for f in api.check(broken, select=["CFG001"])[0].findings] == ["CFG001"]
    assert "CFG001" not in [f.code for f in api.check(broken, ignore=["CFG"])[0].findings]


def test_an_unreadable_model_is_a_result_with_its_error_and_bad_arguments_raise(tmp_path):
    (missing,) = api.check(tmp_path / "nowhere")
    assert missing.error == f"{tmp_path / 'nowhere'}: no such model directory" and missing.findings == []
    for call, said in ((lambda: api.check([]), "no models"), (lambda: api.check(tmp_path, engine="nope"), "nope"),
                       (lambda: api.check(tmp_path, select=["XYZ"]), "XYZ"),
                       (lambda: api.check(tmp_path, dry_run=True, static=True), "dry_run"),
                       (lambda: api.budget(tmp_path, context=0), "context 0"),
                       (lambda: api.budget(tmp_path, engine="hf"), "'hf'"),
                       (lambda: api.triage(tmp_path), "directory")):
        with pytest.raises(InputError, match=said):
            call()


def test_budget_is_the_budget_commands_document(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b", checkpoint=False)
    doc = api.budget(model, kv_budget="40GiB", context=8192)
    cli = json.loads(run("budget", str(model), "--kv-budget", "40GiB", "--context", "8192", "--format", "json").stdout)
    assert doc == cli and doc["inputs"]["context"] == 8192 and {row["engine"] for row in doc["engines"]} >= {"vllm"}


def test_triage_reads_a_file_or_lines(tmp_path):
    from kvdoctor.catalog import builtin_catalog

    message = builtin_catalog()["SWA001"].error.message
    log = tmp_path / "server.log"
    log.write_text(f"starting\nRuntimeError: {message}\n")
    from_file = api.triage(log)
    from_lines = api.triage(["starting", f"\x1b[31mRuntimeError: {message}\x1b[0m"])
    assert [h.entry.code for h in from_file.hits] == [h.entry.code for h in from_lines.hits] == ["SWA001"]
    assert from_file.hits[0].lines == from_lines.hits[0].lines == [2]
    assert api.triage(["nothing known here"]).hits == []


def test_the_api_is_versioned_and_says_what_it_offers():
    major, minor = (int(part) for part in api.API_VERSION.split("."))
    assert major >= 1 and minor >= 0
    assert set(api.__all__) >= {"check", "budget", "triage", "Result", "Finding", "InputError", "API_VERSION"}
    assert all(getattr(api, name).__doc__ for name in ("check", "budget", "triage"))
