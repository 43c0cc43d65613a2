"""`kvdoctor budget --engine mlx-lm` and `check --engine mlx-lm` decide alike whether mlx-lm honours
`--max-kv-size`: both read the pinned wheel's make_cache list (kvdoctor/data/mlx_lm_models.json) for the
module mlx-lm loads for the whole config (a VLM's outer model_type)."""
from __future__ import annotations

import pytest
from msgspec.structs import replace

from helpers import REAL, ROOT
from kvdoctor.engines import profile
from kvdoctor.engines.mlx_lm import budget as mb
from kvdoctor.engines.mlx_lm.plan import module_of, plan_from
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.engines.sglang_mlx.mlxlm import make_cache_module, shipped_models
from kvdoctor.errors import InputError
from kvdoctor.load.loader import load_model

CORPUS = ROOT / "fixtures" / "configs" / "real"
MAX_KV = 4096


def budget_honours(spec) -> bool | None:
    """The budget's decision, as `kvdoctor budget` reaches it (the profile's facts, one mode)."""
    facts = profile("mlx-lm").budget_facts(spec)
    mode = mb.Mode(context=8192, kv_budget_bytes=1 << 34, max_kv_size=MAX_KV)
    return mb.plan(facts, mode, spec.config).mode.max_kv_size_honored


def test_every_model_type_in_the_shipped_data_gets_the_plans_decision():
    data = shipped_models()
    base = load_model(str(REAL / "Qwen__Qwen2.5-7B-Instruct"), with_checkpoint=False)  # has a sliding_window
    types = sorted(set(data["modules"]) | set(data["remapping"]))
    ignored = []
    for model_type in types:
        spec = replace(base, model_type=model_type, raw_config={**base.raw_config, "model_type": model_type},
                       config={**base.config, "model_type": model_type})
        plan_ignores = make_cache_module(module_of(spec))  # what plan_from records as facts.make_cache
        assert budget_honours(spec) is (not plan_ignores), model_type
        ignored += [model_type] if plan_ignores else []
    # the three the budget's hand-written table missed, and a remap onto a make_cache module
    assert {"qwen3_5_moe", "glm_moe_dsa", "prism_hadamard_qwen35", "mistral"} <= set(ignored)
    assert "qwen2" not in ignored and "kimi_k2" not in ignored  # kimi_k2 -> deepseek_v3: no make_cache


@pytest.fixture(scope="module")
def real_specs(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("real")
    out = {}
    for path in sorted(CORPUS.glob("*.json")):
        d = root / path.stem
        d.mkdir()
        (d / "config.json").write_bytes(path.read_bytes())
        out[path.stem] = load_model(str(d), with_checkpoint=False)
    return out


def test_budget_and_check_agree_over_the_real_configs(real_specs):
    settings = MlxLmSettings(max_kv_size=MAX_KV)
    compared, unpriced = {}, []
    for name, spec in real_specs.items():
        plan = plan_from(spec, settings)
        try:
            honoured = budget_honours(spec)
        except InputError:  # a layer kind the budget cannot price: `kvdoctor budget` says so, no decision
            unpriced.append(name)
            continue
        assert honoured is (not plan.facts.make_cache), name
        said = any("ignores max_kv_size" in note for note in plan.notes)
        assert said is (not honoured), name
        compared[name] = honoured
    assert len(compared) >= 0.8 * len(real_specs), unpriced
    # a VLM is loaded by its outer model_type: Devstral's mistral3 honours the flag (its text model,
    # ministral3, would not), Kimi-K3's kimi_k3 and Qwen3.5's qwen3_5_moe build their own caches
    assert compared["mistralai__Devstral-Small-2-24B-Instruct"] is True
    assert compared["moonshotai__Kimi-K3"] is False and compared["Qwen__Qwen3.5-35B-A3B"] is False


def test_the_budget_names_the_loaded_class_when_it_ignores_the_flag(real_specs):
    facts = profile("mlx-lm").budget_facts(real_specs["Qwen__Qwen3.5-35B-A3B"])
    got = mb.plan(facts, mb.Mode(context=8192, kv_budget_bytes=1 << 34, max_kv_size=MAX_KV),
                  real_specs["Qwen__Qwen3.5-35B-A3B"].config)
    assert got.notes == [f"mlx-lm's qwen3_5_moe class builds its own caches (make_cache): --max-kv-size {MAX_KV} "
                         "is ignored"]
    assert got.error is not None and "does not price yet" in got.error.message  # its GDN caches: not priced

