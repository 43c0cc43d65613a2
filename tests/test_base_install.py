"""The base install (no kvdoctor[mlx]) never reports an error because a package is missing: the
sglang-mlx plan reads the pinned mlx-lm's model list shipped in kvdoctor/data, and where only mlx-lm's
class can tell the layout it says so in a note. mlx-lm is made missing the way tests/test_extras.py
does it (an extra whose module cannot be found); tools/base_vs_full.py compares a real bare venv."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from kvdoctor import extras
from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.sglang_mlx import mlxlm
from kvdoctor.pipeline.check import Options, check_target

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "fixtures" / "configs" / "real"
# One of each kind of answer: the table (gpt-oss, gemma-3, DeepSeek-V3's ENG003, MiMo-V2-Flash's ENG004 and
# ENG005, Nemotron-Super's make_cache count, SGL120), the class only (Qwen3-8B: a note), the shipped
# ModelArgs fields (Qwen3-VL-8B: its text_config lacks tie_word_embeddings, ENG002), a model type the pinned
# mlx-lm lacks (chatglm: ENG001 either way), a refused quantization.
NAMES = ("openai__gpt-oss-20b", "google__gemma-3-1b-it", "deepseek-ai__DeepSeek-V3", "THUDM__chatglm2-6b",
         "poolside__Laguna-XS.2-FP8", "Qwen__Qwen3-8B", "Qwen__Qwen3-VL-8B-Instruct", "XiaomiMiMo__MiMo-V2-Flash",
         "nvidia__Llama-3_3-Nemotron-Super-49B-v1")


def _errors_and_warnings(target: Path) -> tuple[set[tuple[str, str]], list[str], set[str]]:
    result = check_target(str(target), Options(catalog=builtin_catalog(), engine="sglang-mlx", static=True))
    assert result.error is None
    return ({(f.code, str(f.severity)) for f in result.findings if str(f.severity) in ("error", "warning")},
            list(result.info.get("engine_notes", [])), {row.get("cache") for row in result.layers})


@pytest.fixture
def models(tmp_path) -> dict[str, Path]:
    out = {}
    for name in NAMES:
        (tmp_path / name).mkdir()
        shutil.copyfile(CONFIGS / f"{name}.json", tmp_path / name / "config.json")
        out[name] = tmp_path / name
    return out


def _without_mlx_lm(monkeypatch) -> None:
    monkeypatch.setitem(extras.EXTRAS, "mlx", ("kvdoctor_no_such_module",))
    mlxlm._remappings.cache_clear()


def test_without_mlx_lm_the_errors_and_warnings_are_the_full_installs(models, monkeypatch):
    full = {name: _errors_and_warnings(path) for name, path in models.items()}
    _without_mlx_lm(monkeypatch)
    try:
        base = {name: _errors_and_warnings(path) for name, path in models.items()}
    finally:
        mlxlm._remappings.cache_clear()
    for name in NAMES:
        assert base[name][0] == full[name][0], name
    assert ("ENG001", "error") in base["THUDM__chatglm2-6b"][0]
    assert ("ENG063", "error") in base["poolside__Laguna-XS.2-FP8"][0]
    assert ("ENG003", "error") in base["deepseek-ai__DeepSeek-V3"][0]
    assert ("ENG002", "error") in base["Qwen__Qwen3-VL-8B-Instruct"][0]
    assert {("ENG004", "error"), ("ENG005", "error")} <= base["XiaomiMiMo__MiMo-V2-Flash"][0]
    assert ("SGL120", "error") in base["nvidia__Llama-3_3-Nemotron-Super-49B-v1"][0]
    notes = " ".join(note for _, found, _ in base.values() for note in found)
    assert "kvdoctor's mlx extra" in base["Qwen__Qwen3-8B"][1][0]
    assert "mlx-lm is not installed" in base["deepseek-ai__DeepSeek-V3"][1][0]
    assert base["Qwen__Qwen3-8B"][2] == {"unknown"} and full["Qwen__Qwen3-8B"][2] == {"contiguous"}  # not "none"
    assert "installed mlx-lm" not in notes and PINS["mlx-lm"] not in notes


def test_remaps_come_from_the_shipped_list_without_mlx_lm(monkeypatch):
    _without_mlx_lm(monkeypatch)
    try:
        assert mlxlm.module_name_for({"model_type": "mistral"}) == "llama"
        assert mlxlm.build_skeleton({"model_type": "mistral"}).not_installed
        missing = mlxlm.build_skeleton({"model_type": "kvdoctor_no_such_type"})
        assert missing.missing_module and missing.error_message == "Model type kvdoctor_no_such_type not supported."
    finally:
        mlxlm._remappings.cache_clear()


@pytest.mark.skipif(importlib.util.find_spec("mlx_lm") is None, reason="mlx-lm is not installed")
def test_shipped_list_is_the_installed_mlx_lm(monkeypatch):
    import importlib.metadata

    shipped = json.loads(mlxlm.MODELS_DATA.read_text())
    package = Path(importlib.util.find_spec("mlx_lm").submodule_search_locations[0])
    assert shipped["mlx-lm"] == importlib.metadata.version("mlx-lm") == PINS["mlx-lm"]
    assert shipped["modules"] == sorted(p.stem for p in (package / "models").glob("*.py") if p.stem != "__init__")
    remap, by_arch = mlxlm._remappings()  # read from the installed utils.py
    assert shipped["remapping"] == remap
    assert {(t, a): m for t, a, m in shipped["architecture_remapping"]} == by_arch
