"""The published JSON Schema of the `--format json` document (kvdoctor/data/report.schema.json): every
fixture model under every engine validates against it, probes and all, and so do the real configs,
an unreadable target, a baseline's summary and a deploy file's run."""
from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from helpers import REAL, ROOT, make_model, run
from kvdoctor import api
from kvdoctor.engines import check_engines
from kvdoctor.resources import data_dir

SCHEMA = json.loads((data_dir() / "report.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"[:300] for e in VALIDATOR.iter_errors(doc)]


def _short(cfg: dict) -> None:
    cfg["layer_types"] = cfg["layer_types"][:-1]  # the demo's broken copy


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[str]:
    """Every fixture model (config only), the demo pair with sparse checkpoints, and a missing path."""
    tmp = tmp_path_factory.mktemp("schema")
    demo = [make_model(tmp, "gpt-oss-20b", dirname="demo/gpt-oss-20b"),
            make_model(tmp, "gpt-oss-20b", edit=_short, dirname="demo/gpt-oss-20b-broken")]
    return [str(REAL), *map(str, demo), str(tmp / "missing")]


def test_the_schema_is_a_valid_schema_tied_to_the_code():
    from kvdoctor.catalog.codes import CODE_RE
    from kvdoctor.engines.base import STAGES
    from kvdoctor.model import SEVERITIES

    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert api.report_schema() == SCHEMA  # what embedding tools are given
    defs = SCHEMA["$defs"]
    assert defs["finding"]["properties"]["severity"]["enum"] == list(SEVERITIES)
    assert defs["engine_error"]["properties"]["stage"]["enum"] == list(STAGES)
    assert defs["code"]["pattern"] == CODE_RE.pattern


@pytest.mark.parametrize("engine", check_engines())
def test_every_fixture_model_validates_under_every_engine(models, engine):
    proc = run("check", *models, "--engine", engine, "--format", "json", "--jobs", "2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]  # the missing path
    doc = json.loads(proc.stdout)
    assert len(doc["results"]) == len(list(REAL.iterdir())) + 3 and doc["results"][-1]["error"]
    assert any(r["findings"] for r in doc["results"])
    assert errors(doc) == []


@pytest.mark.parametrize("engine", check_engines())
def test_every_real_config_validates_under_every_engine(tmp_path_factory, engine):
    real = ROOT / "fixtures" / "configs" / "real"
    root = tmp_path_factory.mktemp(f"real-{engine}")
    for config in sorted(real.glob("*.json")):
        (root / config.stem).mkdir()
        shutil.copy(config, root / config.stem / "config.json")
    proc = run("check", str(root), "--engine", engine, "--static", "--format", "json", "--jobs", "2")
    doc = json.loads(proc.stdout)
    assert len(doc["results"]) == len(list(real.glob("*.json"))) > 100, proc.stderr[-2000:]
    assert errors(doc) == []


def test_a_deploy_file_and_a_baseline_validate(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b", checkpoint=False, edit=_short)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text((ROOT / "fixtures" / "demo" / "vllm-too-long.yaml").read_text())
    baseline = tmp_path / "baseline.json"
    first = run("check", str(model), "--engine", "vllm", "--deploy", str(deploy), "--static",
                "--write-baseline", str(baseline), "--format", "json")
    again = run("check", str(model), "--engine", "vllm", "--deploy", str(deploy), "--static",
                "--baseline", str(baseline), "--format", "json")
    for proc in (first, again):
        assert "Traceback" not in proc.stderr, proc.stderr
        assert errors(json.loads(proc.stdout)) == []
    doc = json.loads(again.stdout)
    assert doc["deploy"] == str(deploy) and doc["summary"]["suppressed"] > 0


def test_the_schema_rejects_a_document_that_breaks_the_contract(models):
    doc = json.loads(run("check", models[2], "--format", "json", "--static").stdout)
    assert errors(doc) == []
    finding = doc["results"][0]["findings"][0]
    for change in ({"severity": "fatal"}, {"code": "cfg1"}, {"layer": -1}, {"fixes": "one"}, {"extra": 1}):
        broken = json.loads(json.dumps(doc))
        broken["results"][0]["findings"][0] = {**finding, **change}
        assert errors(broken), change
    del doc["results"][0]["layers"][0]["window"]
    assert errors(doc)
