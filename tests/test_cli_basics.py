"""Exit codes, one-line input errors, selection and the catalog commands, through the real CLI."""
from __future__ import annotations

import json
import struct

from helpers import REAL, check_json, codes, make_model, run


def test_python_dash_m_and_version():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("kvdoctor ")


def test_json_contract(tmp_path):
    d = make_model(tmp_path, "gpt-oss-20b", edit=lambda c: c["layer_types"].pop())
    code, doc = check_json(str(d))
    assert code == 1
    assert doc["tool"]["name"] == "kvdoctor"
    result = doc["results"][0]
    assert set(result) >= {"target", "model_type", "engine", "engine_versions", "layers", "findings"}
    finding = result["findings"][0]
    assert set(finding) >= {"code", "name", "severity", "message", "layer", "file", "line", "engine_error",
                            "evidence", "fixes"}
    assert finding["fixes"] and doc["summary"]["errors"] >= 1 and doc["summary"]["targets"] == 1


def test_rich_report_shows_layout_and_findings(tmp_path):
    d = make_model(tmp_path, "gpt-oss-20b", edit=lambda c: c["layer_types"].pop())
    proc = run("check", str(d))
    assert proc.returncode == 1
    assert "SFSFSFSF" in proc.stdout and "CFG001" in proc.stdout and "fix:" in proc.stdout


def test_malformed_json_is_one_line_exit_2(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", ')
    proc = run("check", str(d))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "config.json" in line and "not valid JSON" in line


def test_missing_config_exit_2(tmp_path):
    proc = run("check", str(tmp_path))
    assert proc.returncode == 2 and "no config.json" in proc.stderr and "Traceback" not in proc.stderr


def test_truncated_safetensors_header_exit_2(tmp_path):
    d = make_model(tmp_path, "llama-3.1-8b", checkpoint=False)
    with (d / "model.safetensors").open("wb") as fh:
        fh.write(struct.pack("<Q", 10_000))
        fh.write(b'{"a": {"dtype": "F16"')
    proc = run("check", str(d))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model.safetensors" in proc.stderr and "truncated" in proc.stderr


def test_select_ignore_and_fail_on(tmp_path):
    d = make_model(tmp_path, "phi3-mini", checkpoint=False)  # CFG010 info + CKPT008 info
    code, doc = check_json(str(d))
    assert code == 0 and set(codes(doc)) == {"CFG010", "CKPT008"}
    code, doc = check_json(str(d), "--fail-on", "info")
    assert code == 1
    code, doc = check_json(str(d), "--select", "CFG")
    assert codes(doc) == ["CFG010"]
    code, doc = check_json(str(d), "--ignore", "CFG010", "--fail-on", "info")
    assert codes(doc) == ["CKPT008"] and code == 1
    code, doc = check_json(str(d), "--select", "CKPT", "--ignore", "CKPT008", "--fail-on", "info")
    assert codes(doc) == [] and code == 0


def test_unknown_selector_is_a_usage_error():
    proc = run("check", str(REAL / "openai__gpt-oss-20b"), "--select", "NOPE")
    assert proc.returncode == 2 and "NOPE" in proc.stderr


def test_exit_zero_never_hides_2(tmp_path):
    proc = run("check", str(tmp_path / "absent"), "--exit-zero")
    assert proc.returncode == 2


def test_rules_and_explain():
    proc = run("rules", "--format", "json")
    entries = json.loads(proc.stdout)
    assert proc.returncode == 0 and {"CFG001", "CKPT001"} <= {e["code"] for e in entries}
    proc = run("explain", "CKPT003")
    assert proc.returncode == 0
    assert "Logit edit rows do not match" in proc.stdout and "before" in proc.stdout
    proc = run("explain", "XYZ999")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_rich_report_lists_state_caches_per_tp(tmp_path):
    """Kimi-Linear under the sglang profile: shapes and bytes per slot at TP 1, 2, 4 and 8."""
    d = make_model(tmp_path, "kimi-linear", shards=2)
    proc = run("check", str(d), "--engine", "sglang", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "bytes/slot" in out and "32x128x128" in out and "4x16x128" in out
    initial = next(line for line in out.splitlines() if "initial_state" in line).split()
    assert initial[1:5] == ["initial_state", "32x128x128", "16x128x128", "8x128x128"]  # a column per TP size
    for per_slot in ("2,957,312", "1,478,656", "739,328", "369,664"):
        assert per_slot in out
    assert "0-2, 4-6, 8-10" in out  # the 20 KDA layers share one row; MLA layers 3, 7, ... are not in it


def test_the_check_request_has_the_check_commands_parameters_and_defaults():
    """typer's `check` hands its parameters to CheckRequest by name; a request built directly (tests,
    benchmarks) gets the command line's defaults."""
    import typer.main

    from kvdoctor.cli import app
    from kvdoctor.cli.check import CheckRequest

    params = typer.main.get_command(app.app).commands["check"].params
    assert [p.name for p in params] == list(CheckRequest.__struct_fields__)
    for param in params:
        assert getattr(CheckRequest(), param.name) == (None if param.multiple or param.nargs == -1 else param.default), param.name
