"""The sglang-mlx profile's pieces on their own: the runner's start-up checks on model views that no
mlx-lm 0.32.2 class produces, the fallback table against the real mlx-lm classes (on every real config
of each type it covers), and the cheap import."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REAL, SHORT
from kvdoctor.checks.context import Context
from kvdoctor.engines.deploy import Deploy
from kvdoctor.engines.base import Plan
from kvdoctor.engines.sglang_mlx.profile import (FALLBACK_TABLE, KvConfig, MlxFacts, build_layout, explained,
                                                 geometry_check, kv_config, mlx_config, startup_refusals, table_view)
from kvdoctor.load.loader import load_model
from kvdoctor.engines.sglang_mlx.mlxlm import LayerView, ModelView, build_skeleton, module_name_for, read_view
from kvdoctor.model import Source

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "configs" / "real"


def view_of(kinds: list[str], layer_types=None, window=None, make_cache=True) -> ModelView:
    """A model view: "a" = attention layer, "x" = auxiliary (no attention child), "f" = flagged sliding."""
    layers = []
    for i, kind in enumerate(kinds):
        layer = LayerView(index=i, layer_class="custom.Block")
        if kind in "af":
            layer.attention_attr, layer.contract_children = "self_attn", ["self_attn"]
            layer.n_heads, layer.n_kv_heads, layer.head_dim = 8, 2, 64
            layer.sliding_flag = "self_attn.is_swa" if kind == "f" else None
        layers.append(layer)
    return ModelView(model_class="custom.Model", container_class="custom.Inner", layer_types=layer_types,
                     window=window, window_attr="sliding_window" if window else None, layers=layers,
                     has_make_cache=make_cache)


def refusals(view: ModelView, kv: dict | None = None) -> list:
    layout = build_layout(view)
    kv = kv or {i: KvConfig(2, 64, "bfloat16", Source("default", "x")) for i in layout.attention}
    return startup_refusals(view, layout, kv, model=None)


def test_auxiliary_state_with_sliding_layers_is_refused():
    view = view_of(["x", "a", "x", "a"], layer_types=["linear_attention", "sliding_attention"] * 2, window=64)
    got = refusals(view)
    assert [(r.code, r.error_class, r.layer) for r in got] == [("ENG006", "NotImplementedError", 1)]
    assert got[0].message == ("MLX runner does not support models with both auxiliary cache state and "
                              "sliding-window attention layers.")


def test_auxiliary_state_without_make_cache_is_refused():
    got = refusals(view_of(["x", "a"], make_cache=False))
    assert [r.code for r in got] == ["ENG008"]
    assert got[0].message == "MLX models with auxiliary cache state require model.make_cache()."


def test_no_layer_list_at_all():
    got = refusals(view_of([]))
    assert [(r.code, r.message) for r in got] == [("ENG007", "MLX model has no supported attention layers")]


def test_kv_head_count_present_but_none():
    view = view_of(["a", "a"])
    src = Source("default", "x")
    kv = {0: KvConfig(2, 64, "bfloat16", src), 1: KvConfig(None, 64, "bfloat16", src)}
    got = refusals(view, kv)
    assert [(r.code, r.message) for r in got][0] == (
        "ENG013", "Cannot determine n_kv_heads from attention module at layer 1")


def test_flagged_layer_without_map_is_refused_at_its_index():
    got = refusals(view_of(["a", "a", "f", "a"]))
    assert [(r.code, r.layer) for r in got] == [("ENG004", 2)]


def test_healthy_view_is_served():
    view = view_of(["a", "a", "a", "a"], layer_types=["sliding_attention", "full_attention"] * 2, window=64)
    assert refusals(view) == []
    layout = build_layout(view)
    assert layout.sliding == [0, 2] and layout.full_pool_index == {1: 0, 3: 1}
    assert layout.attention_index == {0: 0, 1: 1, 2: 2, 3: 3}


def test_eng006_finding_points_at_layer_types():
    from kvdoctor.checks import eng, refusals as refusal_rule

    spec = load_model(str(REAL / SHORT["gpt-oss-20b"]))
    view = view_of(["x", "a"] * 12, layer_types=["linear_attention", "sliding_attention"] * 12, window=128)
    layout = build_layout(view)
    facts = MlxFacts(view=view, layout=layout, kv={}, refused=True)
    plan = Plan(engine="sglang-mlx", versions={}, layers=(), facts=facts,
                refusals=tuple(explained(r, facts, spec) for r in refusals(view)))
    ctx = Context(spec=spec, engine="sglang-mlx", deploy=Deploy(), plan=plan)
    assert list(eng.run(ctx)) == []  # a model the engine refuses has no serving differences to report
    (finding,) = list(refusal_rule.run(ctx))
    assert finding.engine_error == {"class": "NotImplementedError", "stage": "startup",
                                    "message": plan.refusals[0].message}
    assert finding.code == "ENG006" and finding.key == "layer_types" and finding.line is not None
    assert "layers 0, 2, 4" in finding.message


def _module(path: Path) -> str:
    cfg = json.loads(path.read_text())
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    cfg.setdefault("model_type", text.get("model_type"))
    return module_name_for(cfg)


def _tabled_configs() -> list[Path]:
    """Every real config (fixtures/configs/real) whose mlx-lm module has a FALLBACK_TABLE entry."""
    return [path for path in sorted(CONFIGS.glob("*.json")) if _module(path) in FALLBACK_TABLE]


def test_every_table_entry_meets_a_real_config():
    assert {_module(p) for p in _tabled_configs()} == set(FALLBACK_TABLE)


@pytest.mark.parametrize("config", _tabled_configs(), ids=lambda p: p.stem)
def test_fallback_table_agrees_with_the_real_mlx_lm_class(config, tmp_path):
    (tmp_path / "config.json").write_bytes(config.read_bytes())
    spec = load_model(str(tmp_path), with_checkpoint=False)
    real_model = build_skeleton(mlx_config(spec), expected=geometry_check(spec)).model
    real_view = read_view(real_model)
    table = table_view(module_name_for(mlx_config(spec)), spec)
    assert table is not None and table.source == "table"
    real_layout, table_layout = build_layout(real_view), build_layout(table)
    assert (table_layout.attention, table_layout.windows) == (real_layout.attention, real_layout.windows)
    kv = {i: kv_config(spec, real_view.layers[i]) for i in real_layout.attention}
    expect = [(r.code, r.message) for r in startup_refusals(real_view, real_layout, kv, real_model)]
    assert [(r.code, r.message) for r in startup_refusals(table, table_layout, kv, None)] == expect


def test_mistral_is_remapped_to_llama():
    assert module_name_for({"model_type": "mistral"}) == "llama"
    assert module_name_for({"model_type": "gpt_oss"}) == "gpt_oss"


def test_cheap_import_still_completes_the_package_on_demand():
    code = ("import sys; from kvdoctor.engines.sglang_mlx.mlxlm import use_cheap_import; use_cheap_import(); "
            "import mlx_lm.models.cache; before = 'mlx_lm.utils' in sys.modules; "
            "from mlx_lm import load; print(before, callable(load))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
