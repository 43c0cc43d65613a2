"""`[tool.kvdoctor]` / kvdoctor.toml: nearest file wins, the command line beats it, `kvdoctor config`
shows where each setting came from, and bad settings are one-line input errors."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import make_model, run
from kvdoctor.catalog import builtin_catalog
from kvdoctor.errors import InputError
from kvdoctor.cli.settings import CommandLine, find_config, resolve

CODES = builtin_catalog().codes()


@pytest.fixture(autouse=True)
def _restore_cwd(monkeypatch):
    monkeypatch.chdir(Path.cwd())  # settings() changes directory; monkeypatch changes it back


def settings(cwd: Path, **cli):
    """Resolve settings as a user working in `cwd` would."""
    os.chdir(cwd)
    return resolve(CommandLine(**cli), CODES)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_nearest_file_wins_and_kvdoctor_toml_beats_pyproject_in_one_folder(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.kvdoctor]\nselect = ['CFG']\n")
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    assert find_config(inner) == tmp_path / "pyproject.toml"
    write(tmp_path / "a" / "pyproject.toml", "[project]\nname = 'x'\n")  # no [tool.kvdoctor]: passed over
    assert find_config(inner) == tmp_path / "pyproject.toml"
    write(tmp_path / "a" / "kvdoctor.toml", "select = ['CKPT']\n")
    assert find_config(inner) == tmp_path / "a" / "kvdoctor.toml"
    write(tmp_path / "a" / "pyproject.toml", "[tool.kvdoctor]\nselect = ['CFG001']\n")
    assert find_config(inner) == tmp_path / "a" / "kvdoctor.toml"
    s = settings(inner)
    assert s.selection.select == ("CKPT",) and s.root == tmp_path / "a"


def test_file_values_and_their_origins(tmp_path):
    write(tmp_path / "deploy" / "mlx.yaml", "sglang_mlx:\n  chunked_prefill_size: 4096\n")
    write(tmp_path / "pyproject.toml", """[project]
name = "demo"

[tool.kvdoctor]
select = ["CFG", "CKPT"]
ignore = ["CFG009"]
extend-select = ["LIM"]
engine = "hf"
deploy = "deploy/mlx.yaml"
fail-on = "warning"

[tool.kvdoctor.severity]
CFG004 = "error"

[tool.kvdoctor.per-model-ignores]
"models/legacy-*" = ["CKPT"]
""")
    sub = tmp_path / "ci"
    sub.mkdir()
    s = settings(sub)
    py = tmp_path / "pyproject.toml"
    assert s.selection.select == ("CFG", "CKPT") and s.selection.ignore == ("CFG009",)
    assert s.selection.extend_select == ("LIM",)
    assert s.fail_on == "warning" and s.severity == {"CFG004": "error"}
    assert s.deploy.path == "../deploy/mlx.yaml" and s.deploy.settings("sglang-mlx").chunked_prefill_size == 4096
    assert s.origins["select"] == f"{py}:5"
    assert s.origins["ignore"] == f"{py}:6"
    assert s.origins["fail-on"] == f"{py}:10"
    assert s.origins["severity"] == f"{py}:12"
    assert s.origins["per-model-ignores"] == f"{py}:15"
    assert s.origins["engine"] == f"{py}:8"
    assert s.selection_for("models/legacy-7b").enabled("CKPT001") is False
    assert s.selection_for("models/new-7b").enabled("CKPT001") is True


def test_command_line_beats_the_file(tmp_path):
    write(tmp_path / "kvdoctor.toml", 'select = ["CFG"]\nignore = ["CFG009", "CFG010"]\nfail-on = "info"\n'
                                      '[severity]\nCFG004 = "error"\n')
    s = settings(tmp_path, select=("CKPT",), fail_on="error", severity={"CFG004": "info"})
    assert s.selection.select == ("CKPT",) and s.selection.ignore == ()  # --select starts afresh, as in ruff
    assert s.fail_on == "error" and s.severity == {"CFG004": "info"}
    assert s.origins["select"] == s.origins["fail-on"] == "command line"
    assert s.origins["severity"] == f"{tmp_path / 'kvdoctor.toml'}:4 + command line"
    s = settings(tmp_path, ignore=("CFG001",), extend_select=("CFG010",))
    assert s.selection.select == ("CFG",)
    assert s.selection.enabled("CFG010") and not s.selection.enabled("CFG009") and not s.selection.enabled("CFG001")
    assert s.origins["ignore"] == f"{tmp_path / 'kvdoctor.toml'}:2 + command line"


def test_engine_order_command_line_then_deploy_file_then_config(tmp_path):
    write(tmp_path / "kvdoctor.toml", 'engine = "sglang-mlx"\n')
    assert settings(tmp_path).engine == "sglang-mlx"
    write(tmp_path / "d.yaml", "engine: sglang\n")
    assert settings(tmp_path, deploy="d.yaml").engine == "sglang"
    assert settings(tmp_path, deploy="d.yaml", engine="hf").engine == "hf"
    assert settings(tmp_path, isolated=True).engine == "hf"


@pytest.mark.parametrize("text, message", [
    ("select = [\"CFG\"\n", "not valid TOML"),
    ("selct = [\"CFG\"]\n", "kvdoctor.toml:1: setting 'selct'"),
    ("\nfail-on = \"fatal\"\n", "kvdoctor.toml:2: setting 'fail-on'"),
    ("select = [\"NOPE\"]\n", "kvdoctor.toml:1: unknown rule selector(s): NOPE"),
    ("[severity]\nCFG004 = \"loud\"\n", "kvdoctor.toml:2: setting 'severity.CFG004'"),
    ("[severity]\nXYZ001 = \"error\"\n", "unknown rule code(s): XYZ001"),
    ("[per-model-ignores]\n\"m/*\" = [\"QQ\"]\n", "kvdoctor.toml:2: unknown rule selector(s): QQ"),
    ("engine = \"trtllm\"\n", "kvdoctor.toml:1: unknown engine 'trtllm'"),
    ("deploy = \"missing.yaml\"\n", "missing.yaml"),
])
def test_bad_settings_name_the_file_and_line(tmp_path, text, message):
    write(tmp_path / "kvdoctor.toml", text)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings(tmp_path)


def test_check_uses_the_file_and_the_command_line_beats_it(tmp_path):
    make_model(tmp_path, "llama-3.1-8b", dirname="models/warn", edit=lambda c: c.update(sliding_window=4096))
    write(tmp_path / "kvdoctor.toml", 'fail-on = "warning"\n')
    assert run("check", "--static", "models/warn", "--format", "concise", cwd=tmp_path).returncode == 1
    assert run("check", "--static", "models/warn", "--format", "concise", "--fail-on", "error",
               cwd=tmp_path).returncode == 0
    assert run("check", "--static", "models/warn", "--format", "concise", "--isolated", cwd=tmp_path).returncode == 0
    write(tmp_path / "kvdoctor.toml", '[severity]\nCFG004 = "error"\n[per-model-ignores]\n"models/quiet*" = ["CFG004"]\n')
    proc = run("check", "--static", "models/warn", "--format", "concise", cwd=tmp_path)
    assert proc.returncode == 1 and "CFG004 [error]" in proc.stdout
    proc = run("check", "--static", "models/warn", "--format", "concise", "--severity", "CFG004=info", cwd=tmp_path)
    assert proc.returncode == 0 and "CFG004 [info]" in proc.stdout
    make_model(tmp_path, "llama-3.1-8b", dirname="models/quiet", edit=lambda c: c.update(sliding_window=4096))
    proc = run("check", "--static", "models/warn", "models/quiet", "--format", "json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert [[f["code"] for f in r["findings"]] for r in doc["results"]] == [["CFG004"], []]


def test_config_command_shows_values_and_origins(tmp_path):
    cfg = write(tmp_path / "kvdoctor.toml", 'select = ["CFG"]\nfail-on = "warning"\n')
    proc = run("config", "--format", "json", "--ignore", "CFG009", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["config file"]["value"] == str(cfg)
    assert doc["select"] == {"value": ["CFG"], "from": f"{cfg}:1"}
    assert doc["fail-on"] == {"value": "warning", "from": f"{cfg}:2"}
    assert doc["ignore"] == {"value": ["CFG009"], "from": "command line"}
    assert doc["engine"] == {"value": "hf", "from": "default"}
    proc = run("config", cwd=tmp_path)
    assert proc.returncode == 0 and "kvdoctor.toml:2" in proc.stdout and "fail-on" in proc.stdout
    write(tmp_path / "kvdoctor.toml", "selct = 1\n")
    proc = run("config", cwd=tmp_path)
    assert proc.returncode == 2 and "kvdoctor.toml:1: setting 'selct'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_explicit_config_path(tmp_path):
    other = write(tmp_path / "ci" / "strict.toml", 'fail-on = "info"\n')
    s = settings(tmp_path, config=str(other))
    assert s.fail_on == "info" and s.root == tmp_path / "ci" and s.config == other
    with pytest.raises(InputError, match="config file not found"):
        settings(tmp_path, config=str(tmp_path / "nope.toml"))
