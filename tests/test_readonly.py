"""Read-only and inert: a check never writes inside a model directory, never imports or runs code
the model ships, and never touches the network, with every engine profile that is installed."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from badinput_base import tree_state
from helpers import REAL, REAL_NAMES, codes, make_model

from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.engines import check_engines
from kvdoctor.load.synth import layout_for, write_checkpoint

ENGINE_NAMES = sorted(check_engines())
CONSOLE_SCRIPT = Path(sys.executable).with_name("kvdoctor")

# Files a model may ship that Python would run if anything imported them or put the model dir on
# sys.path: each one records that it ran by creating a marker file outside the model directory.
PLANTED = ["configuration_evil.py", "modeling_evil.py", "tokenization_evil.py", "__init__.py", "sitecustomize.py",
           "usercustomize.py", "json.py", "yaml.py", "typer.py", "rich.py", "torch.py", "mlx.py", "mlx_lm.py",
           "safetensors.py", "transformers.py", "numpy.py", "kvdoctor.py"]


def run_cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    """The installed `kvdoctor` console script, as a user runs it (sys.path[0] is its own folder)."""
    import subprocess

    proc = subprocess.run([str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=900,
                          env={**os.environ, "COLUMNS": "120"})
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def real_models(tmp_path_factory) -> list[Path]:
    """Every real config with a sparse real-shape checkpoint, made read-only."""
    root = tmp_path_factory.mktemp("real")
    dirs = []
    for name in REAL_NAMES:
        d = root / name
        d.mkdir()
        shutil.copy(REAL / name / "config.json", d / "config.json")
        write_checkpoint(d, layout_for(d), shards=2)
        dirs.append(d)
    for d in dirs:
        for f in d.iterdir():
            f.chmod(0o444)
        d.chmod(0o555)
    yield dirs
    for d in dirs:
        d.chmod(0o755)


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_checks_never_write_into_model_dirs(engine, real_models, tmp_path):
    before = {d: tree_state(d) for d in real_models}
    rc, out, err = run_cli("check", "--engine", engine, "--format", "json", *map(str, real_models), cwd=tmp_path)
    assert "Traceback" not in err and rc in (0, 1), err
    assert len(json.loads(out)["results"]) == len(real_models)
    for d in real_models:
        assert tree_state(d) == before[d], f"{engine} changed {d.name}"


@pytest.fixture
def booby_trapped(tmp_path) -> tuple[Path, Path]:
    """A model that ships code (auto_map, trust_remote_code) and shadows common module names."""
    markers = tmp_path / "markers"
    markers.mkdir()

    def edit(cfg: dict) -> None:
        cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                           "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
        cfg["trust_remote_code"] = True

    m = make_model(tmp_path, "gemma-3-1b-it", edit=edit, dirname="evil-model")
    for name in PLANTED:
        (m / name).write_text(f"import pathlib\npathlib.Path({str(markers / name)!r}).write_text('ran')\n")
    return m, markers


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_shipped_code_never_runs(engine, booby_trapped):
    m, markers = booby_trapped
    before = tree_state(m)
    rc, out, err = run_cli("check", "--engine", engine, "--format", "json", ".", cwd=m)
    assert "Traceback" not in err and rc in (0, 1), err
    assert sorted(p.name for p in markers.iterdir()) == []
    assert "CFG010" in codes(json.loads(out))  # reported, as info
    assert tree_state(m) == before


def test_planted_files_would_have_left_a_marker(booby_trapped):
    """The trap works: importing one of the planted files does create its marker."""
    m, markers = booby_trapped
    sys.path.insert(0, str(m))
    try:
        importlib.import_module("configuration_evil")
    finally:
        sys.path.remove(str(m))
        sys.modules.pop("configuration_evil", None)
    assert [p.name for p in markers.iterdir()] == ["configuration_evil.py"]


@pytest.fixture
def no_network(monkeypatch):
    """Every way out through a socket raises and is recorded."""
    attempts: list[str] = []

    def refuse(name):
        def blocked(*args, **kwargs):
            attempts.append(f"{name}{args[1:] if name.startswith('socket.') else args}")
            raise OSError("network use in a test of kvdoctor")
        return blocked

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    return attempts


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_no_network(engine, real_models, no_network, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    opts = Options(catalog=builtin_catalog(), engine=engine)
    for d in real_models[:4]:
        assert check_target(str(d), opts).error is None
    missing = check_target("some-org/not-in-the-cache", opts)
    assert missing.error and "fetches nothing" in missing.error
    assert no_network == []
