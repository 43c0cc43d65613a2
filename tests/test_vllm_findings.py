"""Each VLM catalog entry the vLLM profile produces: a fixture makes it fire, a healthy one keeps it quiet.

Refusals come from the profile's plan (their texts are checked against vLLM's own in
test_vllm_profile.py); silent differences from kvdoctor.engines.vllm.differences.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.vllm.differences import differences
from kvdoctor.engines.vllm.profile import VllmProfile, facts_json, plan
from kvdoctor.engines.vllm.refusals import CODES
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "fixtures" / "models"
REAL = ROOT / "fixtures" / "configs" / "real"


def config(name: str) -> dict:
    path = MODELS / name / "config.json"
    return json.loads((path if path.exists() else REAL / f"{name}.json").read_text())


def spec_of(tmp_path: Path, cfg: dict, name: str = "model"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return load_model(str(folder), library_check=False)


def edited(name: str, **changes) -> dict:
    cfg = copy.deepcopy(config(name))
    cfg.update(changes)
    return cfg


def rotated_layer_types(name: str) -> dict:
    cfg = copy.deepcopy(config(name))
    cfg["layer_types"] = cfg["layer_types"][1:] + cfg["layer_types"][:1]
    return cfg


REFUSALS = [  # code, config, settings that make it fire; the same config with healthy settings stays quiet
    ("VLM001", lambda: edited("allenai__Olmo-3.1-32B-Instruct",
                              layer_types=config("allenai__Olmo-3.1-32B-Instruct")["layer_types"][:-1]), {}),
    ("VLM002", lambda: config("google__gemma-3-1b-it"), {"max_model_len": 65536}),
    ("MEM014", lambda: config("google__gemma-3-1b-it"), {"tensor_parallel_size": 8}),
    ("MEM002", lambda: config("Qwen__Qwen3-Next-80B-A3B-Instruct"), {"disable_hybrid_kv_cache_manager": True}),
    ("MEM004", lambda: config("meta-llama__Llama-3.1-8B"), {"kv_budget": "4GiB"}),
    ("VLM006", lambda: config("meta-llama__Llama-3.1-8B"), {"kv_budget": 256 << 10}),
    ("VLM007", lambda: edited("Qwen__Qwen3-Next-80B-A3B-Instruct", layer_types=["sliding_attention"] * 48,
                              sliding_window=4096), {}),
    ("VLM009", lambda: edited("Qwen__Qwen2.5-7B-Instruct", use_sliding_window=True, sliding_window=4096,
                              max_window_layers=14), {}),
    ("VLM011", lambda: config("deepseek-ai__DeepSeek-V3"), {"kv_cache_dtype": "nvfp4"}),
    ("VLM012", lambda: config("Qwen__Qwen3-Next-80B-A3B-Instruct"), {"mamba_block_size": 64,
                                                                     "enable_prefix_caching": False}),
    # LagunaConfig (a type outside kvdoctor's table) checks the layer_types length with its own validator
    ("VLM032", lambda: edited("poolside__Laguna-XS.2-FP8",
                              layer_types=config("poolside__Laguna-XS.2-FP8")["layer_types"][:-1]), {}),
]


@pytest.mark.parametrize("code, make, settings", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal_fires_and_healthy_stays_quiet(code, make, settings, tmp_path):
    got = plan(spec_of(tmp_path, make(), "bad"), VllmSettings(**settings))
    assert [r.code for r in got.refusals] == [code]
    refusal = got.refusals[0]
    assert refusal.stage == "startup" and refusal.source == CODES[code]
    assert "/v0.33.0/" in refusal.source or "/v5.20.2/" in refusal.source
    entry = builtin_catalog().get(code)
    assert entry is not None and entry.severity == "error"
    if entry.error is not None:
        assert re.search(entry.error.pattern, refusal.message), "triage must name the profile's own text"
    healthy = plan(spec_of(tmp_path, config(_healthy(code)), "good"), VllmSettings())
    assert healthy.refusals == ()


def _healthy(code: str) -> str:
    return {"VLM001": "allenai__Olmo-3.1-32B-Instruct", "VLM007": "Qwen__Qwen3-Next-80B-A3B-Instruct",
            "VLM009": "Qwen__Qwen2.5-7B-Instruct", "MEM002": "Qwen__Qwen3-Next-80B-A3B-Instruct",
            "MEM004": "meta-llama__Llama-3.1-8B", "VLM006": "meta-llama__Llama-3.1-8B",
            "VLM011": "deepseek-ai__DeepSeek-V3",
            "VLM012": "Qwen__Qwen3-Next-80B-A3B-Instruct",
            "VLM032": "poolside__Laguna-XS.2-FP8"}.get(code, "google__gemma-3-1b-it")


def test_hma_forced_on_with_chunked_eagle_is_refused(tmp_path):
    spec = spec_of(tmp_path, config("meta-llama__Llama-4-Scout-17B-16E-Instruct"))
    eagle = {"method": "eagle", "num_speculative_tokens": 2}
    forced = plan(spec, VllmSettings(disable_hybrid_kv_cache_manager=False, speculative_config=eagle,
                                     max_model_len=32768))
    assert [r.code for r in forced.refusals] == ["VLM008"]
    auto = plan(spec, VllmSettings(speculative_config=eagle, max_model_len=32768))
    assert auto.refusals == () and auto.facts.hma is False and "EAGLE" in auto.facts.hma_why
    plain = plan(spec, VllmSettings(max_model_len=32768))
    assert plain.facts.hma is True


def codes(tmp_path, cfg, name="m", **settings) -> list[str]:
    spec = spec_of(tmp_path, cfg, name)
    return [f.code for f in differences(spec, plan(spec, VllmSettings(**settings)))]


def test_vlm020_window_vllm_applies_differently(tmp_path):
    assert "VLM020" in codes(tmp_path, rotated_layer_types("openai__gpt-oss-20b"), "shifted")
    assert "VLM020" not in codes(tmp_path, config("openai__gpt-oss-20b"), "healthy")
    # Olmo 3 reads layer_types per layer: the shifted list is what vLLM applies, nothing differs
    assert "VLM020" not in codes(tmp_path, rotated_layer_types("allenai__Olmo-3.1-32B-Instruct"), "olmo")


def test_vlm021_full_reservation_with_hma_off(tmp_path):
    cfg = config("google__gemma-3-1b-it")
    spec = spec_of(tmp_path, cfg)
    off = differences(spec, plan(spec, VllmSettings(disable_hybrid_kv_cache_manager=True)))
    cost = [f for f in off if f.code == "VLM021"]
    assert len(cost) == 1 and cost[0].evidence["extra_bytes_per_request"] > 0
    assert len(cost[0].evidence["layers"]) == 22  # gemma-3-1b: 22 of 26 layers slide
    assert "VLM021" not in [f.code for f in differences(spec, plan(spec, VllmSettings()))]


def test_vlm022_model_level_window(tmp_path):
    assert "VLM022" in codes(tmp_path, config("mistralai__Mistral-7B-v0.1"), "mistral")
    assert "VLM022" not in codes(tmp_path, config("meta-llama__Llama-3.1-8B"), "llama")
    assert "VLM022" not in codes(tmp_path, config("openai__gpt-oss-20b"), "gptoss")


def test_vlm023_mtp_layers(tmp_path):
    assert "VLM023" in codes(tmp_path, config("deepseek-ai__DeepSeek-V3"), "dsv3")
    assert "VLM023" not in codes(tmp_path, config("meta-llama__Llama-3.1-8B"), "llama")


def test_every_vlm_entry_has_a_pinned_public_reference():
    catalog = builtin_catalog()
    for code in [c for c in catalog.codes() if c.startswith("VLM0")]:  # the profile's own entries
        entry = catalog[code]
        urls = [r for r in entry.references if r.startswith("https://")]
        assert urls and all(r.startswith("https://github.com/") for r in urls), code
        assert all("/v0.33.0/" in r or "/v5.20.2/" in r for r in urls), code


def test_report_and_settings(tmp_path):
    spec = spec_of(tmp_path, config("google__gemma-3-1b-it"))
    profile = VllmProfile()
    got = profile.plan(spec, VllmSettings())
    info = profile.report(got, {})["vllm"]
    assert info == facts_json(got.facts)
    assert info["architecture"] == "Gemma3ForCausalLM" and info["hma"]["on"] is True
    assert [g["spec"] for g in info["groups"]].count("FullAttentionSpec") == 1
    assert info["max_model_len"] == 32768
    with pytest.raises(Exception):
        VllmSettings(tensor_parallel_size="8")  # strict: no string coercion
    with pytest.raises(Exception):
        VllmSettings(surprise=1)
    with pytest.raises(Exception):
        VllmSettings(kv_budget="forty")


@pytest.mark.parametrize("name, planned", [("nvidia__Nemotron-H-56B-Base-8K", True), ("LiquidAI__LFM2.5-VL-1.6B", True),
                                           ("deepseek-ai__DeepSeek-V4-Flash", False),
                                           ("nvidia__Llama-3_3-Nemotron-Super-49B-v1", False)])
def test_hybrid_classes_are_planned_or_left_to_the_dry_run(name, planned, tmp_path):
    got = plan(spec_of(tmp_path, config(name)), VllmSettings())
    assert (got.facts.unmodeled is None) is planned
    specs = {layer.extra.get("engine_spec") for layer in got.layers}
    assert ({"MambaSpec", "FullAttentionSpec"} <= specs) is planned


def test_a_qwen2_vl_window_without_use_sliding_window_is_dropped(tmp_path):
    """Qwen2.5-VL's text configuration class drops sliding_window unless use_sliding_window is set; vLLM
    0.33.0 then gives every layer FullAttentionSpec (held-out set 3, where the profile gave a window)."""
    cfg = edited("Qwen__Qwen2.5-VL-7B-Instruct", sliding_window=4096)
    assert cfg["use_sliding_window"] is False
    planned = plan(spec_of(tmp_path, cfg), VllmSettings())
    assert {layer.extra["engine_spec"] for layer in planned.layers} == {"FullAttentionSpec"}
    assert {layer.extra["engine_spec"] for layer in plan(spec_of(tmp_path, edited(
        "Qwen__Qwen2.5-VL-7B-Instruct", sliding_window=4096, use_sliding_window=True), "flag"), VllmSettings()).layers
    } != {"FullAttentionSpec"}  # the flag keeps the window: the test can tell the two apart
