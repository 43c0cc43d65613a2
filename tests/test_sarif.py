"""SARIF 2.1.0 output: valid against the official schema, with what GitHub code scanning reads."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from helpers import make_model, run
from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.deploy import load_deploy
from kvdoctor.model import Finding, Result
from kvdoctor.report import Report
from kvdoctor.report.sarif import FINGERPRINT_KEY, document

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def validate(doc: dict) -> None:
    jsonschema.Draft4Validator(SCHEMA).validate(doc)


def line_of(path: Path, needle: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("sarif")
    make_model(root, "gpt-oss-20b", dirname="models/clean")
    make_model(root, "gpt-oss-20b", dirname="models/broken",
               edit=lambda c: c.update(layer_types=c["layer_types"][:-1]))
    make_model(root, "llama-3.1-8b", dirname="models/warn", edit=lambda c: c.update(sliding_window=4096))
    return root


def sarif(root: Path, *targets: str) -> tuple[int, dict]:
    proc = run("check", "--static", "--format", "sarif", *targets, cwd=root)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_schema_file_is_the_official_one():
    assert SCHEMA["id"] == "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
    with pytest.raises(jsonschema.ValidationError):  # the validator does reject a broken log
        validate({"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]})


def test_a_run_with_findings_and_an_unreadable_target_validates(project):
    rc, doc = sarif(project, "models/broken", "models/warn", "models/clean", "models/nothing-here")
    assert rc == 2
    validate(doc)
    run_ = doc["runs"][0]
    assert [r["ruleId"] for r in run_["results"]] == ["CFG001", "CFG004"]
    assert [r["level"] for r in run_["results"]] == ["error", "warning"]
    invocation = run_["invocations"][0]
    assert invocation["executionSuccessful"] is False
    assert "models/nothing-here" in invocation["toolExecutionNotifications"][0]["message"]["text"]


def test_results_point_at_the_config_key_line_repo_relative(project):
    _, doc = sarif(project, "models/broken", "models/warn")
    results = doc["runs"][0]["results"]
    loc = results[0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "models/broken/config.json", "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] == line_of(project / "models/broken/config.json", '"layer_types"')
    loc = results[1]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "models/warn/config.json"
    assert loc["region"]["startLine"] == line_of(project / "models/warn/config.json", '"sliding_window"')
    assert doc["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == project.resolve().as_uri() + "/"


def test_rules_carry_catalog_descriptions_and_help(project):
    _, doc = sarif(project, "models/broken")
    driver = doc["runs"][0]["tool"]["driver"]
    assert driver["name"] == "kvdoctor"
    rules = {r["id"]: r for r in driver["rules"]}
    catalog = builtin_catalog()
    # every rule the run checked is described, passing or not
    assert {"CFG001", "CFG004", "CKPT001"} <= set(rules)
    entry = catalog["CFG001"]
    rule = rules["CFG001"]
    assert rule["name"] == entry.name
    assert rule["shortDescription"]["text"] == entry.summary
    assert rule["fullDescription"]["text"] == entry.meaning.strip()
    assert entry.fixes[0].summary in rule["help"]["text"] and entry.fixes[0].summary in rule["help"]["markdown"]
    assert rule["defaultConfiguration"]["level"] == "error"
    assert rules["CFG009"]["defaultConfiguration"]["level"] == "note"  # an info rule
    result = doc["runs"][0]["results"][0]
    assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]


def test_rule_ids_and_fingerprints_survive_edits_that_move_lines(project, tmp_path):
    _, before = sarif(project, "models/broken")
    cfg_path = project / "models/broken/config.json"
    original = cfg_path.read_text()
    cfg = json.loads(original)
    try:
        cfg = {"_comment": "moved every line down", "architectures_note": "x", **cfg}
        cfg_path.write_text(json.dumps(cfg, indent=2))
        _, after = sarif(project, "models/broken")
    finally:
        cfg_path.write_text(original)
    (b,), (a,) = before["runs"][0]["results"], after["runs"][0]["results"]
    assert a["ruleId"] == b["ruleId"] == "CFG001"
    assert a["locations"][0]["physicalLocation"]["region"]["startLine"] == \
        b["locations"][0]["physicalLocation"]["region"]["startLine"] + 2
    assert a["partialFingerprints"] == b["partialFingerprints"]
    assert len(a["partialFingerprints"][FINGERPRINT_KEY]) == 24


def test_a_deploy_setting_finding_points_at_the_deploy_file_line(tmp_path, monkeypatch):
    """Findings from deploy settings carry the deploy file as given on the command line; SARIF must
    turn it into a path relative to the project root, with the setting's line."""
    project = tmp_path / "repo"
    (project / "deploy").mkdir(parents=True)
    (project / "deploy" / "sglang.yaml").write_text("engine: sglang\nsglang:\n  tp_size: 4\n")
    monkeypatch.chdir(project / "deploy")  # the user runs kvdoctor from a subfolder
    deploy = load_deploy("sglang.yaml")
    src = deploy.source("sglang.tp_size")
    finding = Finding.at("CFG004", "a finding about a deploy setting", src, severity="warning",
                         name="window-without-sliding-layers")
    result = Result(target="../models/m", model_type="x", engine="sglang", engine_versions={}, layers=[],
                    findings=[finding])
    doc = document(Report([result], builtin_catalog(), project, deploy_path=deploy.path))
    validate(doc)
    loc = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "deploy/sglang.yaml"
    assert loc["region"]["startLine"] == 3
    assert doc["runs"][0]["results"][0]["properties"]["key"] == "sglang.tp_size"


def test_paths_with_spaces_are_percent_encoded(tmp_path):
    make_model(tmp_path, "gpt-oss-20b", dirname="my models/broken",
               edit=lambda c: c.update(layer_types=c["layer_types"][:-1]))
    _, doc = sarif(tmp_path, "my models/broken")
    validate(doc)
    uri = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "my%20models/broken/config.json"


def test_end_to_end_deploy_finding_points_at_the_deploy_line(tmp_path):
    """A real deploy-setting finding (KDA061: an unsupported decode backend for ReplaySSM), checked from
    a subfolder of a project whose root is marked by kvdoctor.toml."""
    if builtin_catalog().get("KDA061") is None:
        pytest.skip("KDA061 not in the catalog yet")
    (tmp_path / "kvdoctor.toml").write_text('engine = "sglang"\n')
    make_model(tmp_path, "kimi-linear", dirname="models/kimi")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "sglang.yaml").write_text(
        "sglang:\n  enable_linear_replayssm: true\n  linear_attn_decode_backend: flashinfer\n")
    proc = run("check", "../models/kimi", "--deploy", "sglang.yaml", "--select", "KDA061", "--format", "sarif",
               cwd=tmp_path / "deploy")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    (result,) = doc["runs"][0]["results"]
    loc = result["locations"][0]["physicalLocation"]
    assert result["ruleId"] == "KDA061"
    assert loc["artifactLocation"] == {"uri": "deploy/sglang.yaml", "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] == 3
    assert result["properties"]["model"] == "models/kimi"
