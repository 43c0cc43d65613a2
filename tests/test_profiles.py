"""Engine profiles behind one interface: the registry, the typed frozen plan, one deploy section per
profile shared by check and budget, the version pins written once, and a made-up engine that needs
nothing but its own module and a registry line."""
from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from helpers import REAL, SHORT, check_json, make_model, run
from kvdoctor import engines
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.checks import all_checks
from kvdoctor.engines.deploy import Section, deploy_from, load_deploy
from kvdoctor.engines.base import EngineProfile, LayerPlan, Plan, Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.errors import InputError

PACKAGE = Path(__file__).resolve().parent.parent / "kvdoctor"


def test_every_pinned_version_is_written_once():
    """In pins.py (PINS, and PROFILED beside it); elsewhere only as a boundary of the release data in an engine's
    own releases.py, which cites the code at each tag."""
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    for version in PINS.values():
        where = {str(p.relative_to(PACKAGE)) for p, text in sources.items() if f'"{version}"' in text}
        assert "engines/pins.py" in where
        assert where - {"engines/pins.py"} <= {"engines/vllm/releases.py", "engines/sglang/releases.py"}, (version, where)


def test_every_profile_reads_its_pins_and_declares_a_section():
    for name in engines.PROFILES:
        cls = engines.profile_class(name)
        assert cls.name == name and issubclass(cls.Settings, Section)
        assert all(PINS[dist] == version for dist, version in cls.pins.items())
    assert engines.check_engines() == ["hf", "vllm", "sglang", "sglang-mlx", "mlx-lm"]
    assert engines.budget_engines() == ["vllm", "sglang", "mlx-lm"]
    assert engines.dry_run_engines() == ["vllm", "sglang", "sglang-mlx", "mlx-lm"]


def test_the_plan_is_frozen():
    hf = engines.profile("hf")
    from kvdoctor.load.loader import load_model

    plan = hf.plan(load_model(str(REAL / SHORT["gpt-oss-20b"])), hf.Settings())
    with pytest.raises(AttributeError, match="immutable"):
        plan.refusals = ()  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        plan.layers[0].cache = "x"  # type: ignore[misc]
    assert not hasattr(plan, "data")


def test_probe_and_dry_run_rules_are_not_static():
    needs = {check.module: check.rule for check in all_checks()}
    assert needs["kvdoctor.checks.swa"].probes == ("mask_routing",)
    assert not needs["kvdoctor.checks.dryrun"].static and needs["kvdoctor.checks.refusals"].static


# ---- one deploy section per profile, read by check and budget ---------------------------------------

def test_one_knob_one_name_for_check_and_budget(tmp_path):
    kimi = make_model(tmp_path, "kimi-linear", checkpoint=False)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("budget:\n  kv_budget: 40GiB\n  context: 8192\n  engines: [sglang]\nsglang:\n  tp_size: 2\n")
    _, doc = check_json(str(kimi), "--engine", "sglang", "--deploy", str(deploy), "--exit-zero")
    assert doc["results"][0]["info"]["kda_replayssm"]["tp_sizes"] == [2]
    proc = run("budget", str(kimi), "--engine", "sglang", "--deploy", str(deploy), "--format", "json")
    assert proc.returncode == 0 and "warning" not in proc.stderr
    assert [row["mode"]["tp"] for row in json.loads(proc.stdout)["engines"]] == [2]


def test_the_old_spelling_is_read_with_a_warning(tmp_path):
    kimi = make_model(tmp_path, "kimi-linear", checkpoint=False)
    deploy = tmp_path / "old.yaml"
    deploy.write_text("budget:\n  kv_budget: 40GiB\n  sglang:\n    tp: 2\n    page_size: 64\n")
    loaded = load_deploy(str(deploy))
    assert loaded.settings("sglang").tp_size == 2 and loaded.settings("sglang").page_size == 64
    source = loaded.source("sglang.tp_size")
    assert (source.ref, source.line) == ("budget.sglang.tp", 4)  # the user's own spelling and line
    [warning] = loaded.warnings
    assert f"{deploy}:3" in warning and "budget.sglang.tp -> sglang.tp_size" in warning
    proc = run("budget", str(kimi), "--engine", "sglang", "--deploy", str(deploy), "--format", "json")
    assert proc.returncode == 0 and "kvdoctor: warning:" in proc.stderr and "'budget.sglang'" in proc.stderr
    assert [row["mode"]["tp"] for row in json.loads(proc.stdout)["engines"]] == [2]


def test_old_and_new_spelling_of_one_knob_is_refused(tmp_path):
    deploy = tmp_path / "both.yaml"
    deploy.write_text("sglang:\n  tp_size: 4\nbudget:\n  sglang:\n    tp: 2\n")
    with pytest.raises(InputError, match=r"both\.yaml:5: setting 'budget\.sglang\.tp' is the old spelling of "
                                         r"'sglang\.tp_size'"):
        load_deploy(str(deploy))


def test_a_section_is_validated_by_its_profile(tmp_path):
    deploy = tmp_path / "bad.yaml"
    deploy.write_text("vllm:\n  hma: true\n  tp: zero\n")
    with pytest.raises(InputError, match=r"bad\.yaml:3: setting 'vllm\.tp'"):
        load_deploy(str(deploy))
    deploy.write_text("sglang_mlx:\n  no_such_knob: 1\n")
    with pytest.raises(InputError, match=r"bad\.yaml:2: setting 'sglang_mlx\.no_such_knob': Extra inputs"):
        load_deploy(str(deploy))
    assert deploy_from({}).settings("vllm").tensor_parallel_size == 1  # every knob at the engine's default


# ---- a made-up engine: one module and one registry line ---------------------------------------------

class ToySettings(Section):
    window: int = Field(64, ge=1)
    strict: bool = False


class ToyProfile(EngineProfile):
    """Applies one window to every layer, and refuses (in strict mode) models with more than 4 layers."""

    name = "toy"
    pins: dict[str, str] = {}
    Settings = ToySettings
    refusal_codes = ("ENG007",)

    def plan(self, spec: Any, settings: Any) -> Plan[None]:
        layers = tuple(LayerPlan(index=l.index, engine_window=settings.window, cache="windowed") for l in spec.layers)
        refusals = ()
        if settings.strict and len(layers) > 4:
            refusals = (Refusal("ENG007", "RuntimeError", "toy serves at most 4 layers", "startup",
                                key="num_hidden_layers", explanation=f"toy refuses {len(layers)} layers"),)
        return Plan(engine=self.name, versions={}, layers=layers, refusals=refusals)

    def report(self, plan: Plan[Any], observations: Any) -> dict[str, Any]:
        return {"toy": {"layers": len(plan.layers)}}


@pytest.fixture
def toy(monkeypatch):
    module = types.ModuleType("toy_engine")
    module.ToyProfile = ToyProfile  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toy_engine", module)
    monkeypatch.setitem(engines.PROFILES, "toy", "toy_engine:ToyProfile")
    for cached in (engines.profile_class, engines.profile):
        cached.cache_clear()
    yield
    for cached in (engines.profile_class, engines.profile):
        cached.cache_clear()


def test_a_made_up_engine_needs_only_its_profile(toy, tmp_path):
    model = make_model(tmp_path, "llama-3.1-8b", checkpoint=False)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("toy:\n  window: 128\n  strict: true\n")
    assert "toy" in engines.check_engines() and "toy" not in engines.budget_engines()
    result = check_target(str(model), Options(catalog=builtin_catalog(), engine="toy",
                                              deploy=load_deploy(str(deploy))))
    assert result.error is None and result.engine == "toy"
    assert {row["engine_window"] for row in result.layers} == {128}
    [refused] = [f for f in result.findings if f.code == "ENG007"]
    assert refused.message == "toy refuses 32 layers" and refused.key == "num_hidden_layers"
    assert refused.engine_error == {"class": "RuntimeError", "message": "toy serves at most 4 layers",
                                    "stage": "startup"}
    assert result.info["toy"] == {"layers": 32}
    deploy.write_text("toy:\n  window: 0\n")
    with pytest.raises(InputError, match=r"deploy\.yaml:2: setting 'toy\.window'"):
        load_deploy(str(deploy))


def test_no_probe_module_names_a_catalog_code():
    codes = set(builtin_catalog().codes())
    probes = [p for folder in ("mlx", "kda", "dryrun") for p in (PACKAGE / folder).glob("*.py")]
    named = {str(p.relative_to(PACKAGE)): sorted(codes & set(re.findall(r"\b[A-Z]{3,4}\d{3}\b", p.read_text())))
             for p in probes}
    assert not any(named.values()), named
