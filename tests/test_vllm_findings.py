"""Each VLM catalog entry the vLLM profile produces: a fixture makes it fire, a healthy one keeps it quiet.

Refusals come from the profile's plan (their texts are checked against vLLM's own in
test_vllm_profile.py); silent differences from kvdoctor.checks.vllm_differences.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.pins import PINS
from kvdoctor.checks.vllm_differences import differences
from kvdoctor.engines.vllm.profile import VllmProfile, facts_json, plan
from kvdoctor.engines.vllm.refusals import CODES
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "fixtures" / "models"
REAL = ROOT / "fixtures" / "configs" / "real"
FRESH = ROOT / "fixtures" / "configs" / "fresh"  # held-out sets 7 and 8


def config(name: str) -> dict:
    path = MODELS / name / "config.json"
    for candidate in (path, REAL / f"{name}.json", FRESH / f"{name}.json"):
        if candidate.exists():
            return json.loads(candidate.read_text())
    raise FileNotFoundError(name)


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
    # mlc-llm's Ministral-3 preset: the text model's type at the top level keeps text_config a plain dict
    ("VLM151", lambda: config("mistralai__Ministral-3-3B-Instruct-2512"), {}),
    # GPT-J's published rope_type, which get_rope does not build (the rule's own entry, shared by the plan)
    ("CFG023", lambda: config("EleutherAI__gpt-j-6b"), {}),
]


@pytest.mark.parametrize("code, make, settings", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal_fires_and_healthy_stays_quiet(code, make, settings, tmp_path):
    got = plan(spec_of(tmp_path, make(), "bad"), VllmSettings(**settings))
    assert [r.code for r in got.refusals] == [code]
    refusal = got.refusals[0]
    assert refusal.stage == "startup" and refusal.source == CODES[code]
    assert f"/v{PINS['vllm']}/" in refusal.source or "/v5.20.2/" in refusal.source
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


def test_vlm152_only_where_the_release_raises_it(tmp_path):
    """vLLM 0.32.0 and 0.33.0 fail promoting DeepSeek-V4's sliding MLA specs with HMA off (their start-up goldens);
    0.30.0 and 0.34.0 get past it, and with HMA on none refuses."""
    spec = spec_of(tmp_path, config("deepseek-ai__DeepSeek-V4-Flash"), "v4")
    for release, fires in (("0.32.0", True), ("0.33.0", True), ("0.30.0", False), ("0.34.0", False)):
        got = plan(spec, VllmSettings(disable_hybrid_kv_cache_manager=True).at_release(release))
        assert ([r.code for r in got.refusals] == ["VLM152"]) is fires, release
        if fires:
            assert got.refusals[0].source.endswith("v1/kv_cache_interface.py#L" + ("138" if release == "0.32.0" else "175"))
            assert re.search(builtin_catalog().get("VLM152").error.pattern, got.refusals[0].message)
    assert plan(spec, VllmSettings().at_release("0.33.0")).refusals == ()


def test_healthy_twins_of_the_set_7_refusals(tmp_path):
    """The configs VLM151 and CFG023 fire on, with the one key fixed, plan without a refusal."""
    composite = edited("mistralai__Ministral-3-3B-Instruct-2512", model_type="mistral3")
    assert plan(spec_of(tmp_path, composite, "mistral3"), VllmSettings()).refusals == ()
    gptj = edited("EleutherAI__gpt-j-6b", rope_scaling=None)
    assert plan(spec_of(tmp_path, gptj, "gptj"), VllmSettings()).refusals == ()


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
    with pytest.raises(ValidationError):
        VllmSettings(tensor_parallel_size="8")  # strict: no string coercion
    with pytest.raises(ValidationError):
        VllmSettings(surprise=1)
    with pytest.raises(ValidationError):
        VllmSettings(kv_budget="forty")


HYBRID_SPECS = {"MambaSpec", "FullAttentionSpec"}


@pytest.mark.parametrize("name, want", [("nvidia__Nemotron-H-56B-Base-8K", HYBRID_SPECS),
                                        ("LiquidAI__LFM2.5-VL-1.6B", HYBRID_SPECS),
                                        ("deepseek-ai__DeepSeek-V4-Flash", {"SlidingWindowMLASpec", "MLAAttentionSpec"}),
                                        ("nvidia__Llama-3_3-Nemotron-Super-49B-v1", None)])
def test_hybrid_classes_are_planned_or_left_to_the_dry_run(name, want, tmp_path):
    # trusted: Nemotron-Super's config class is auto_map code, refused otherwise (VLM143)
    got = plan(spec_of(tmp_path, config(name)), VllmSettings(trust_remote_code=True))
    assert (got.facts.unmodeled is None) is (want is not None)
    specs = {layer.extra["engine_spec"] for layer in got.layers if "engine_spec" in layer.extra}
    assert specs == (want or set())


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


# --- held-out set 4 (issue 14): each test below failed before its fix ---------------------------------

GEMMA3_VLM_TEXT = {  # google/gemma-3-12b-it's text_config as published: no max_position_embeddings
    "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text", "num_attention_heads": 16,
    "num_hidden_layers": 48, "num_key_value_heads": 8, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024}


def test_a_length_key_config_json_omits_takes_the_config_class_default(tmp_path):
    """vLLM reads max_position_embeddings from the transformers config object, so a Gemma 3 VLM whose
    text_config omits it gets Gemma3TextConfig's default (vLLM 0.33.0: max_model_len 131072), not the
    2048 vLLM assumes when no key exists at all."""
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": dict(GEMMA3_VLM_TEXT), "vision_config": {"model_type": "siglip_vision_model"}}
    got = plan(spec_of(tmp_path, cfg), VllmSettings())
    assert not got.refusals
    assert (got.facts.max_model_len, got.facts.derived_from) == (131072, "max_position_embeddings")
    over = plan(spec_of(tmp_path, cfg, "over"), VllmSettings(max_model_len=262144))
    assert [r.code for r in over.refusals] == ["VLM002"]  # the derived limit is the class default
    given = dict(cfg, text_config=dict(GEMMA3_VLM_TEXT, max_position_embeddings=32768))
    assert plan(spec_of(tmp_path, given, "given"), VllmSettings()).facts.max_model_len == 32768


def exaone45_text(**changes) -> dict:
    cfg = copy.deepcopy(json.loads((REAL / "LGAI-EXAONE__EXAONE-4.5-33B.json").read_text()))
    cfg["text_config"].pop("layer_types")
    cfg["text_config"].update(changes)
    return cfg


@pytest.mark.parametrize("changes, error_class, message", [
    ({}, "TypeError", "unsupported operand type(s) for %: 'int' and 'str'"),  # "LLLG" % ...
    ({"sliding_window": None, "sliding_window_pattern": 4}, "ZeroDivisionError", "integer modulo by zero"),
])
def test_exaone4_derives_layer_types_itself_and_can_fail(changes, error_class, message, tmp_path):
    """Exaone4Config computes layer_types from sliding_window_pattern when config.json has none; with the
    published pattern string ("LLLG") vLLM 0.33.0 stops with transformers' TypeError (held-out set 4:
    EXAONE-4.5's text model type exaone4_5_text is read by the same class)."""
    got = plan(spec_of(tmp_path, exaone45_text(**changes)), VllmSettings())
    assert [(r.error_class, r.message) for r in got.refusals] == [(error_class, message)]
    published = json.loads((REAL / "LGAI-EXAONE__EXAONE-4.5-33B.json").read_text())
    assert plan(spec_of(tmp_path, published, "published"), VllmSettings()).refusals == ()


def test_exaone45_text_reads_as_exaone4(tmp_path):
    spec = spec_of(tmp_path, json.loads((REAL / "LGAI-EXAONE__EXAONE-4.5-33B.json").read_text()))
    assert (spec.family, spec.semantics) == ("exaone4", "table")


def test_a_config_class_value_error_reaches_the_user_as_pydantic_wraps_it(tmp_path):
    """vLLM reads config.json inside ModelConfig (a pydantic dataclass): a ValueError from the configuration
    class arrives as ValidationError (Gemma-4's per_layer_config check on an extra layer_types entry)."""
    cfg = copy.deepcopy(config("google__gemma-4-26B-A4B"))
    text = cfg.get("text_config") or cfg
    text["layer_types"] = text["layer_types"] + text["layer_types"][-1:]
    got = plan(spec_of(tmp_path, cfg), VllmSettings())
    assert [r.error_class for r in got.refusals] == ["ValidationError"]
    assert got.refusals[0].message.startswith("`per_layer_config` keys must be integer layer indices")


@pytest.mark.parametrize("extra, refused", [(1, False), (-1, True)])
def test_deepseek_v4_cuts_layer_types_before_its_own_length_check(extra, refused, tmp_path):
    """DeepseekV4Config cuts layer_types to num_hidden_layers before its own validate_layer_type (held-out set 15,
    all layers sliding): an appended MTP entry starts, a list one short is refused in V4's own words."""
    cfg = copy.deepcopy(config("deepseek-ai__DeepSeek-V4-Flash"))
    n = cfg["num_hidden_layers"]
    cfg["layer_types"] = ["sliding_attention"] * (n + extra)
    got = plan(spec_of(tmp_path, cfg), VllmSettings())
    expected = [("VLM001", "Class validation error for validator 'validate_layer_type':\n    ValueError: "
                 f"`num_hidden_layers` ({n}) must equal `len(layer_types)` ({n - 1}).")] if refused else []
    assert [(r.code, r.message) for r in got.refusals] == expected


def test_nvfp4_moe_is_a_cpu_only_obstacle_with_the_weight_quantization_workaround():
    """vLLM 0.33.0's CPU has no NVFP4 MoE kernel (fused_moe/oracle/nvfp4.py); the oracle drops the weight
    quantization, as for MXFP4, and the goldens' NVFP4 MoE points show the workaround taken."""
    from kvdoctor.engines.vllm import startup

    text = "No NvFp4 MoE backend supports the deployment configuration."
    assert (text, "drop_quantization_config") in startup.CPU_OBSTACLES
    golden = json.loads((ROOT / "goldens" / "vllm_check.json").read_text())["points"]
    taken = [p for p in golden if any(e["message"] == text for e in p.get("earlier_attempt_errors", []))]
    assert taken and all("drop_quantization_config" in p["workarounds"] and p["outcome"]["start"] for p in taken)
    assert not any(text in p["outcome"].get("message", "") for p in golden)


def test_goldens_do_not_depend_on_the_hosts_fp8_isa():
    """CPU_ATTN takes an fp8 KV cache only on a host with AVX-512 or AMX; the oracle answers for the dtype
    alone (skipped_cpu_checks), so a golden never carries that refusal."""
    golden = json.loads((ROOT / "goldens" / "vllm_check.json").read_text())["points"]
    assert not any("attention backend on this host" in p["outcome"].get("message", "") for p in golden)
    assert sum(p["setting"] == "fp8" and p["outcome"]["start"] for p in golden) >= 30


def gemma4_31b(tmp_path, name="g4", **text_changes):
    cfg = copy.deepcopy(config("nvidia__Gemma-4-31B-IT-NVFP4"))
    cfg.pop("quantization_config")
    cfg["text_config"].update(text_changes)
    return spec_of(tmp_path, cfg, name)


def test_layers_with_their_own_kv_geometry_get_their_own_pages(tmp_path):
    """Gemma-4-31B's global layers have global_head_dim 512 and 4 KV heads (sliding: 256 and 16): vLLM 0.33.0
    gives them their own spec (half the bytes per token), groups them apart at a doubled block so pages
    match, and with HMA off keeps every layer in one group of one spec type with per-layer pages."""
    spec = gemma4_31b(tmp_path)
    got = plan(spec, VllmSettings(kv_budget="40GiB"))
    assert not got.refusals
    by_spec: dict[str, set] = {}
    for layer in got.layers:
        by_spec.setdefault(layer.extra["engine_spec"], set()).add(
            (layer.extra["num_kv_heads"], layer.extra["head_size"],
             layer.extra["page_size_bytes"] // layer.extra["block_size"]))
    assert by_spec == {"SlidingWindowSpec": {(16, 256, 16 * 256 * 2 * 2)},
                       "FullAttentionSpec": {(4, 512, 4 * 512 * 2 * 2)}}
    groups = got.facts.groups
    assert len(groups) == 6 and len({g.page_bytes for g in groups}) == 1
    full = [g for g in groups if g.spec == "FullAttentionSpec"]
    assert len(full) == 1 and full[0].block_size == 2 * groups[0].block_size
    off = plan(spec, VllmSettings(kv_budget="40GiB", disable_hybrid_kv_cache_manager=True))
    assert [g.spec for g in off.facts.groups] == ["FullAttentionSpec"] and len(off.facts.groups[0].layer_ids) == 60


def test_the_config_class_keeps_gemma4s_last_layer_full(tmp_path):
    """Gemma4TextConfig forces the last layer to full_attention whatever layer_types says; vLLM's model
    class reads the forced list (held-out set 4: all-sliding layer_types still leave layer 59 full)."""
    got = plan(gemma4_31b(tmp_path, layer_types=["sliding_attention"] * 60), VllmSettings(kv_budget="40GiB"))
    kinds = [layer.extra["engine_spec"] for layer in got.layers]
    assert kinds[-1] == "FullAttentionSpec" and set(kinds[:-1]) == {"SlidingWindowSpec"}


def test_a_model_type_unknown_to_vllms_transformers_is_refused_as_vllm_words_it(tmp_path):
    """MiniMax-M3's `minimax_m3`: neither transformers 5.20.2 nor vLLM 0.33.0's own registry has a
    configuration class for it, so AutoConfig stops vLLM (set 5 of the held-out runs: vLLM's own
    ValidationError). A known type, or one that names its own class in auto_map, is not refused so."""
    got = plan(spec_of(tmp_path, config("MiniMaxAI__MiniMax-M3"), "m3"), VllmSettings())
    (refusal,) = got.refusals
    assert (refusal.code, refusal.error_class) == ("VLM138", "ValidationError")
    assert refusal.message.startswith("The checkpoint you are trying to load has model type `minimax_m3` but "
                                      "Transformers does not recognize this architecture.")
    assert refusal.evidence["wrapped_in"] == "1 validation error for ModelConfig"
    for edit in ({"model_type": "llama"}, {"auto_map": {"AutoConfig": "configuration.Config"}}):
        cfg = {**config("MiniMaxAI__MiniMax-M3"), **edit}
        codes = [r.code for r in plan(spec_of(tmp_path, cfg, f"m3-{len(edit)}-{next(iter(edit))}"),
                                      VllmSettings()).refusals]
        assert "VLM138" not in codes, edit


def test_the_model_type_table_is_the_installed_packages_own():
    """kvdoctor/engines/vllm/model_types.json, read back at the pinned release, against transformers' and vLLM's
    own tables from that release's oracle venv when it is there (goldens/vllm_model_types.py writes the file)."""
    import subprocess

    from kvdoctor.engines.vllm import registry

    python = ROOT / "goldens" / ".venv" / f"vllm-{PINS['vllm']}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM {PINS['vllm']} oracle venv (python goldens/releases.py --venv-only vllm=={PINS['vllm']})")
    out = subprocess.run([str(python), str(ROOT / "goldens" / "vllm_model_types.py")], capture_output=True, text=True,
                         timeout=300, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    installed = json.loads(out.stdout)
    assert installed["vllm"] == PINS["vllm"]
    assert installed == registry.table(PINS["vllm"])
    assert "minimax_m3" not in installed["transformers_model_types"] + installed["vllm_model_types"]


def test_mimo_v2_reads_its_hybrid_layer_pattern_and_window_size(tmp_path):
    """mimo_v2.py: a layer slides where hybrid_layer_pattern says 1, over sliding_window_size keys (128;
    transformers' config class sets sliding_window one larger), whatever layer_types says; keys of 192
    and values of 128 (v_head_dim) per head, as vLLM's spec names them."""
    cfg = config("XiaomiMiMo__MiMo-V2-Flash")
    cfg["layer_types"] = ["sliding_attention"] * cfg["num_hidden_layers"]  # ignored by the model class
    got = plan(spec_of(tmp_path, cfg, "mimo"), VllmSettings())
    specs = [layer.extra["engine_spec"] for layer in got.layers]
    assert specs == ["SlidingWindowSpec" if p == 1 else "FullAttentionSpec" for p in cfg["hybrid_layer_pattern"]]
    assert {layer.engine_window for layer in got.layers if layer.extra["engine_spec"] == "SlidingWindowSpec"} == {128}
    first = got.layers[0].extra
    assert (first["head_size"], first["head_size_v"]) == (192, 128)
    # the KV heads follow the pattern too: 8 (swa_num_key_value_heads) on sliding layers, 4 on full ones
    heads = [layer.extra["num_kv_heads"] for layer in got.layers]
    assert heads == [8 if p == 1 else 4 for p in cfg["hybrid_layer_pattern"]]


def test_an_architecture_vllm_does_not_register_is_refused_as_vllm_words_it(tmp_path):
    """Step-3.7-Flash's `Step3p7FlashForCausalLM`: transformers 5.20.2 reads its `step3p7` config but
    exports no class of that name, and vLLM 0.33.0's registry has none, so ModelConfig stops (set 5 of
    the held-out runs). The message lists the registry's architectures in its own order."""
    got = plan(spec_of(tmp_path, config("stepfun-ai__Step-3.7-Flash"), "step"), VllmSettings())
    (refusal,) = got.refusals
    assert (refusal.code, refusal.error_class) == ("VLM139", "ValidationError")
    assert refusal.message.startswith("Model architectures ['Step3p7FlashForCausalLM'] are not supported for now. "
                                      "Supported architectures: dict_keys(['AfmoeForCausalLM', ")
    assert "'Qwen3ForCausalLM'" in refusal.message and refusal.key == "architectures"
    healthy = {**config("stepfun-ai__Step-3.7-Flash"), "architectures": ["Qwen3ForCausalLM"]}
    assert not any(r.code == "VLM139" for r in plan(spec_of(tmp_path, healthy, "as-qwen3"), VllmSettings()).refusals)


@pytest.mark.parametrize("arch, code, words", [
    ("Phi3SmallForCausalLM", "VLM140", "was supported in vLLM until v0.9.2, and is not supported anymore."),
    ("Nemotron3_5AsrForRNNT", "VLM141", "Please install the plugin at "
                                        "https://github.com/Sohaib-Ahmed21/vllm-nemotron-asr-plugin"),
])
def test_an_architecture_vllm_dropped_or_moved_out_is_named_so(arch, code, words, tmp_path):
    got = plan(spec_of(tmp_path, {**config("meta-llama__Llama-3.1-8B"), "architectures": [arch]}), VllmSettings())
    (refusal,) = got.refusals
    assert (refusal.code, refusal.error_class) == (code, "ValidationError")
    assert words in refusal.message and arch in refusal.message
    # the same config under an architecture vLLM still registers starts
    assert not plan(spec_of(tmp_path, config("meta-llama__Llama-3.1-8B"), "registered"), VllmSettings()).refusals


def test_an_architecture_only_transformers_has_is_left_to_the_dry_run(tmp_path):
    """vLLM's Transformers backend takes an architecture transformers exports (BART moved to a plugin,
    but transformers still has BartForConditionalGeneration): whether it runs depends on that class's
    code, so the plan refuses nothing and plans no groups."""
    got = plan(spec_of(tmp_path, {**config("meta-llama__Llama-3.1-8B"),
                                  "architectures": ["BartForConditionalGeneration"]}), VllmSettings())
    assert not got.refusals
    assert "Transformers backend" in got.facts.unmodeled and not got.facts.groups
    from kvdoctor.engines.vllm.registry import resolution
    assert resolution({"architectures": ["LlamaForCausalLM"]}) == "registered"
    assert resolution({"architectures": ["Qwen3ForConditionalGeneration"]}) == "registered"  # the suffix swap


@pytest.mark.parametrize("name, edit, tp, fires", [
    ("microsoft__phi-4", {}, 8, True),  # 40 query heads pass the config check, 10 KV heads do not split
    ("microsoft__phi-4", {}, 2, False),
    ("meta-llama__Llama-3.1-8B", {}, 8, False),  # 8 KV heads, one a rank
    ("meta-llama__Llama-3.1-8B", {"num_key_value_heads": 2}, 8, False),  # each head copied to 4 ranks
    ("meta-llama__Llama-3.1-8B", {"num_key_value_heads": 16}, 8, False),
    ("meta-llama__Llama-3.1-8B", {"num_key_value_heads": 4}, 16, False),
    ("meta-llama__Llama-3.1-8B", {"num_key_value_heads": 12, "num_attention_heads": 48}, 8, True),
    ("meta-llama__Llama-3.1-8B", {"num_key_value_heads": 3, "num_attention_heads": 48}, 8, True),  # 8 % 3
])
def test_kv_heads_that_tp_cannot_split_fail_the_model_build(name, edit, tp, fires, tmp_path):
    """llama.py's attention asserts KV heads % TP == 0 (or TP % KV heads == 0 when fewer) with no message."""
    got = plan(spec_of(tmp_path, {**config(name), **edit}), VllmSettings(tensor_parallel_size=tp))
    codes = [r.code for r in got.refusals]
    assert ("VLM142" in codes) == fires, codes
    if fires:
        (refusal,) = got.refusals
        assert (refusal.error_class, refusal.message, refusal.setting) == ("AssertionError", "",
                                                                           "vllm.tensor_parallel_size")


def test_a_config_class_shipped_as_code_needs_trust_remote_code(tmp_path):
    """Nemotron-Super-49B: `nemotron-nas` is in neither transformers 5.20.2 nor vLLM's registry and
    auto_map names configuration_decilm.DeciLMConfig, so AutoConfig refuses while vLLM's
    trust_remote_code is false (set 5: every point, before the max_model_len check of len2x)."""
    from kvdoctor.engines.deploy import deploy_from
    from kvdoctor.engines.vllm.dryrun import VllmDryRunner, engine_args

    spec = spec_of(tmp_path, config("nvidia__Llama-3_3-Nemotron-Super-49B-v1"), "super")
    (refusal,) = plan(spec, VllmSettings(max_model_len=262144)).refusals
    assert (refusal.code, refusal.error_class, refusal.setting) == ("VLM143", "ValidationError",
                                                                   "vllm.trust_remote_code")
    assert refusal.message.startswith(f"The repository {spec.model_dir} contains custom code which must be executed")
    trusted = plan(spec, VllmSettings(trust_remote_code=True))
    assert not trusted.refusals and "trust_remote_code" in trusted.facts.unmodeled  # DeciLM: left to the dry run
    # the dry run would need the checkpoint's code, which its child never has: skipped, and said so
    skipped = VllmDryRunner().run(spec, deploy_from({"vllm": {"trust_remote_code": True}}).settings("vllm"), trusted, {})
    assert not skipped.ran and "auto_map" in skipped.reason
    assert engine_args(VllmSettings(trust_remote_code=True)) == {}
    # a model type transformers has: its own class is used, auto_map or not
    llama = {**config("meta-llama__Llama-3.1-8B"), "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    assert not plan(spec_of(tmp_path, llama, "llama-auto-map"), VllmSettings()).refusals


def oracle_transformers(probe: str):
    """What `probe` prints last (one JSON value) under the vLLM oracle venv's transformers (5.20.2, the release
    vLLM 0.33.0 admits); skipped without that venv."""
    import subprocess

    python = ROOT / "goldens" / ".venv" / "vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip("no vLLM oracle venv (bash goldens/setup_venvs.sh)")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_window_flag_table_is_transformers_own():
    """specs.WINDOW_NEEDS_FLAG against transformers 5.20.2 (the vLLM oracle venv's): the text config
    classes that drop sliding_window when use_sliding_window is false (set 6: SmolLM3's does not)."""
    from kvdoctor.engines.vllm.specs import WINDOW_NEEDS_FLAG

    composite = {"qwen2_vl", "qwen2_5_vl"}  # their text config is one of the others

    probe = (
        "import json, warnings\nwarnings.filterwarnings('ignore')\nfrom transformers import CONFIG_MAPPING\n"
        "drops = []\nfor mt in sorted(CONFIG_MAPPING.keys()):\n    try:\n"
        "        t = CONFIG_MAPPING[mt](use_sliding_window=False, sliding_window=4096).get_text_config().to_dict()\n"
        "    except Exception:\n        continue\n"
        "    if t.get('model_type') == mt and t.get('sliding_window') in (None, 0):\n        drops.append(mt)\n"
        "print(json.dumps(drops))\n")
    assert set(oracle_transformers(probe)) == WINDOW_NEEDS_FLAG - composite


def test_the_read_only_layer_types_table_is_transformers_own():
    """specs.LAYER_TYPES_READ_ONLY against transformers 5.20.2 (the vLLM oracle venv's): the configuration
    classes whose `layer_types` (itself or through attribute_map) is a property without a setter, which a
    config.json that sets it makes raise (set 7: Jamba with every layer sliding)."""
    from kvdoctor.engines.vllm.specs import LAYER_TYPES_READ_ONLY

    probe = (
        "import json, warnings\nwarnings.filterwarnings('ignore')\nfrom transformers import CONFIG_MAPPING\n"
        "found = []\nfor mt in sorted(CONFIG_MAPPING.keys()):\n    cls = CONFIG_MAPPING[mt]\n"
        "    attr = getattr(cls, 'attribute_map', {}).get('layer_types', 'layer_types')\n"
        "    prop = getattr(cls, attr, None)\n"
        "    if isinstance(prop, property) and prop.fset is None:\n        found.append(mt)\n"
        "print(json.dumps(found))\n")
    assert set(oracle_transformers(probe)) == LAYER_TYPES_READ_ONLY


def test_the_mamba_hybrids_asked_of_their_class_are_the_validating_ones():
    """hf_config.MAMBA_CLASS_CHECKED: of the Mamba hybrids kvdoctor's family table reads, those whose transformers
    5.20.2 class defines `validate_architecture` (set 8: Falcon-H1 refused by its own class)."""
    from kvdoctor.load.hf_config import MAMBA_CLASS_CHECKED

    hybrids = ["bamba", "falcon_h1", "granitemoehybrid", "jamba", "zamba", "zamba2", "nemotron_h"]
    probe = ("import json, warnings\nwarnings.filterwarnings('ignore')\nfrom transformers import CONFIG_MAPPING\n"
             f"print(json.dumps([mt for mt in {hybrids!r} if 'validate_architecture' in vars(CONFIG_MAPPING[mt])]))\n")
    assert set(oracle_transformers(probe)) == MAMBA_CLASS_CHECKED


def test_zamba2_default_block_types_are_the_config_class_own():
    """specs.ZAMBA2_DEFAULT_BLOCKS, the hybrid pattern zamba2.py builds when config.json has no layers_block_type,
    against Zamba2Config's own default."""
    from kvdoctor.engines.vllm.specs import ZAMBA2_DEFAULT_BLOCKS

    probe = ("import json, warnings\nwarnings.filterwarnings('ignore')\nfrom transformers import Zamba2Config\n"
             "print(json.dumps(Zamba2Config().layers_block_type))\n")
    assert oracle_transformers(probe) == ZAMBA2_DEFAULT_BLOCKS
