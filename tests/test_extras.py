"""Optional dependencies: a missing extra is one line naming it, and the report says when an installed
engine differs from the version its profile describes."""
from __future__ import annotations

import importlib.metadata

import pytest

from helpers import make_model, run
from kvdoctor import extras
from kvdoctor.engines import require_extras
from kvdoctor.errors import InputError
from kvdoctor.report.versions import engine_line


def test_everything_needed_is_installed_in_the_dev_environment():
    for engine in ("hf", "sglang-mlx", "sglang", "vllm"):
        require_extras(engine, static=False, dry_run=engine == "sglang-mlx")


@pytest.mark.parametrize("engine, static, dry_run, extra", [
    ("sglang-mlx", False, False, "mlx"), ("sglang", False, False, "torch"), ("vllm", False, False, "torch"),
    ("sglang-mlx", False, True, "sglang")])
def test_a_missing_module_names_its_extra(monkeypatch, engine, static, dry_run, extra):
    monkeypatch.setitem(extras.EXTRAS, extra, (*extras.EXTRAS[extra], "kvdoctor_no_such_module"))
    with pytest.raises(InputError) as caught:
        require_extras(engine, static, dry_run)
    assert f"pip install 'kvdoctor[{extra}]'" in str(caught.value) and "kvdoctor_no_such_module" in str(caught.value)


def test_the_static_path_needs_no_extra(monkeypatch):
    for extra in list(extras.EXTRAS):
        monkeypatch.setitem(extras.EXTRAS, extra, ("kvdoctor_no_such_module",))
    for engine in ("hf", "sglang-mlx", "sglang", "vllm"):
        require_extras(engine, static=True, dry_run=False)
    require_extras("hf", static=False, dry_run=False)


def test_module_to_extra():
    assert extras.extra_for_module("mlx.core") == "mlx" and extras.extra_for_module("torch") == "torch"
    assert extras.extra_for_module("sglang.srt") == "sglang" and extras.extra_for_module("yaml") is None


def test_engine_line_says_when_the_installed_version_differs():
    have = importlib.metadata.version("mlx-lm")
    assert engine_line("sglang-mlx", {"mlx-lm": have}) == f"sglang-mlx: mlx-lm {have}"
    assert engine_line("sglang-mlx", {"mlx-lm": "0.0.1"}) == f"sglang-mlx: mlx-lm 0.0.1 (installed: mlx-lm {have})"
    assert engine_line("sglang-mlx", {"kvdoctor-no-such-dist": "1.0"}) == "sglang-mlx: kvdoctor-no-such-dist 1.0"
    assert engine_line("hf", {}) == "hf"


def test_rich_report_shows_the_profile_versions(tmp_path):
    model = make_model(tmp_path, "gemma-2-2b", checkpoint=False)
    proc = run("check", str(model), "--engine", "sglang-mlx", "--static", env={"COLUMNS": "100"})
    from kvdoctor.engines.sglang_mlx.profile import MLX_LM_VERSION, SGLANG_VERSION

    assert f"sglang-mlx: sglang {SGLANG_VERSION}, mlx-lm {MLX_LM_VERSION}" in proc.stdout
