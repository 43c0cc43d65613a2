"""`--engine sglang-mlx` end to end on the real configs and on edited copies: the layout the backend
will use, its load and start-up refusals (ENG), and the divergence warning (SWA005)."""
from __future__ import annotations

import json

import pytest

from helpers import REAL, SHORT, check_json, codes, make_model, real_config

MODELS = ("gpt-oss-20b", "gemma-3-1b-it", "phi3-mini", "mistral-7b", "gemma-2-2b", "llama-3.1-8b", "kimi-linear",
          "qwen3-next", "olmo3", "qwen2.5-7b")

EXAONE4 = {
    "model_type": "exaone4", "architectures": ["Exaone4ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 8,
    "intermediate_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "rms_norm_eps": 1e-5, "vocab_size": 102400, "rope_theta": 1000000.0, "rope_scaling": None,
    "sliding_window": 4096, "sliding_window_pattern": "LLLG", "tie_word_embeddings": False,
    "max_position_embeddings": 65536, "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def real():
    """One CLI run over every real config; results by short name."""
    dirs = [str(REAL / SHORT[name]) for name in MODELS]
    rc, doc = check_json(*dirs, "--engine", "sglang-mlx", "-j", "1")
    assert rc == 1  # gemma-3, Phi-3 and Kimi Linear are refused
    return dict(zip(MODELS, doc["results"]))


def finding(result: dict, code: str) -> dict:
    found = [f for f in result["findings"] if f["code"] == code]
    assert found, f"{code} not in {[f['code'] for f in result['findings']]}"
    return found[0]


def test_gpt_oss_plans_windowed_and_contiguous_layers_and_passes_probes(real):
    r = real["gpt-oss-20b"]
    assert r["engine_versions"] == {"sglang": "0.5.23", "mlx-lm": "0.32.2"}
    windowed = [row for row in r["layers"] if row["cache"] == "windowed"]
    contiguous = [row for row in r["layers"] if row["cache"] == "contiguous"]
    assert [row["index"] for row in windowed] == list(range(0, 24, 2))
    assert {row["engine_window"] for row in windowed} == {128} and {row["window"] for row in windowed} == {128}
    assert [row["index"] for row in contiguous] == list(range(1, 24, 2))
    assert all(row["engine_window"] is None for row in contiguous)
    assert [f["severity"] for f in r["findings"]] == ["info"]  # only CKPT008: no checkpoint in the fixture
    probe = r["info"]["sglang_mlx"]["probe"]
    assert probe["verified"] == 24 * 7 and probe["via_sdpa_kernel"] == 24 * 7
    keys = probe["last_query_keys"]
    # prefill 131 + extend 2 = 133 tokens; the decode queries sit at positions 133..137
    assert keys["native decode 1/3"] == {"sliding": [128], "full": [134]}
    assert keys["batched decode 2/2"] == {"sliding": [128], "full": [138]}
    assert keys["extend chunk of 2 tokens"] == {"sliding": [128], "full": [133]}


def test_gemma3_is_refused_at_startup_naming_layer_0(real):
    f = finding(real["gemma-3-1b-it"], "ENG004")
    assert f["severity"] == "error" and f["layer"] == 0
    assert f["engine_error"] == {
        "class": "NotImplementedError", "stage": "startup",
        "message": "Attention layer 0 declares sliding-window attention but the model exposes no per-layer window "
                   "map (container `layer_types` plus a scalar window), so the MLX KV cache cannot bound its "
                   "sliding-window KV."}
    assert "self_attn.is_sliding" in f["message"] and f["evidence"]["flagged_layers"][:5] == [0, 1, 2, 3, 4]
    assert "SWA005" not in codes({"results": [real["gemma-3-1b-it"]]})  # refused, so no divergence to warn about


@pytest.mark.parametrize("name, layer_class", [("phi3-mini", "mlx_lm.models.phi3.TransformerBlock"),
                                               ("kimi-linear", "mlx_lm.models.kimi_linear.KimiDecoderLayer")])
def test_no_attention_child_refusal_names_the_layer_class(real, name, layer_class):
    f = finding(real[name], "ENG003")
    assert f["engine_error"] == {"class": "ValueError", "stage": "startup",
                                 "message": f"No attention attribute in layer type <class '{layer_class}'>"}
    assert layer_class in f["message"]


def test_phi3_refusal_says_what_the_attention_child_lacks(real):
    assert "self_attn, lacks q_proj, k_proj, v_proj" in finding(real["phi3-mini"], "ENG003")["message"]


@pytest.mark.parametrize("name, layers", [("mistral-7b", 32), ("gemma-2-2b", 13)])
def test_window_the_backend_does_not_apply_is_a_warning(real, name, layers):
    r = real[name]
    f = finding(r, "SWA005")
    assert f["severity"] == "warning" and len(f["evidence"]["layers"]) == layers
    assert f["evidence"]["model_window"] == 4096 and f["evidence"]["engine_window"] is None
    assert not [x for x in r["findings"] if x["severity"] == "error"]
    assert all(row["cache"] == "contiguous" for row in r["layers"])


def test_llama_and_qwen_are_clean(real):
    for name in ("llama-3.1-8b", "qwen2.5-7b"):
        assert codes({"results": [real[name]]}) == ["CKPT008"]


def test_hybrid_linear_attention_layers_keep_native_caches(real):
    r = real["qwen3-next"]
    caches = [row["cache"] for row in r["layers"]]
    assert caches == (["native"] * 3 + ["contiguous"]) * 12
    assert not [f for f in r["findings"] if f["severity"] != "info"]


def test_no_op_attention_blocks_without_caches_are_refused(tmp_path):
    """Nemotron-Super-49B: 31 of its 80 blocks have no attention, and mlx-lm's make_cache() builds a
    cache only for the 49 that do; the runner wants one per layer (SGL120, the engine's own text).
    Qwen3-Next's make_cache() gives one per layer, and it stays clean (above)."""
    model = tmp_path / "nemotron-super"
    model.mkdir()
    (model / "config.json").write_bytes((REAL.parent / "configs" / "real" /
                                         "nvidia__Llama-3_3-Nemotron-Super-49B-v1.json").read_bytes())
    rc, doc = check_json(str(model), "--engine", "sglang-mlx", "--static")
    assert rc == 1
    found = finding(doc["results"][0], "SGL120")
    assert found["severity"] == "error" and found["key"] == "block_configs"
    assert found["engine_error"]["message"] == "model.make_cache() returned 49 entries for 80 layers"
    assert found["evidence"]["make_cache_entries"] == 49 and len(found["evidence"]["auxiliary_layers"]) == 31
    assert "SGL120" not in codes({"results": [check_json(str(REAL / SHORT["qwen3-next"]), "--engine", "sglang-mlx",
                                                           "--static")[1]["results"][0]]})


@pytest.mark.parametrize("fmt", ["nvfp4-pack-quantized", "mxfp4-pack-quantized", "pack-quantized", "float-quantized",
                                 "int-quantized", "naive-quantized", None])
def test_compressed_tensors_formats_are_read_as_mlx_lm_reads_them(fmt):
    """kvdoctor's list of the formats mlx-lm packs, held to mlx-lm's own function: it refuses a format
    exactly where that function raises, with its text."""
    from mlx_lm.utils import _compressed_tensors_quantization

    from kvdoctor.engines.sglang_mlx.mlxlm import quantization_refusal

    settings = {"quant_method": "compressed-tensors", "format": fmt}
    try:
        _compressed_tensors_quantization(settings)
        engine = None
    except ValueError as exc:
        engine = ("compressed-tensors", str(exc))
    assert quantization_refusal({"quantization_config": settings}) == engine


@pytest.mark.parametrize("name, code", [("nvidia__Qwen3.6-27B-NVFP4", "ENG064"), ("poolside__Laguna-XS.2-FP8", "ENG063"),
                                        ("nvidia__GLM-5.1-NVFP4", None), ("moonshotai__Kimi-K2.5", None),
                                        ("openai__gpt-oss-120b", None)])
def test_quantization_mlx_lm_cannot_load_is_refused_at_load(tmp_path, name, code):
    """ModelOpt MIXED_PRECISION and compressed-tensors FP8 stop mlx-lm's loader; ModelOpt NVFP4, packed
    integers and MXFP4 load."""
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_bytes((REAL.parent / "configs" / "real" / f"{name}.json").read_bytes())
    _, doc = check_json(str(model), "--engine", "sglang-mlx", "--static")
    found = {f["code"]: f for f in doc["results"][0]["findings"]}
    assert not {"ENG063", "ENG064"} - {code} & set(found), found.keys()
    if code is not None:
        assert found[code]["key"].endswith("quantization_config") and found[code]["engine_error"]["class"] == "ValueError"


def test_no_real_config_gets_swa001(real):
    assert all("SWA001" not in codes({"results": [r]}) for r in real.values())


def test_olmo3_probe_keeps_big_windows_in_memory(real):
    probe = real["olmo3"]["info"]["sglang_mlx"]["probe"]
    assert probe["true_kv_shape_layers"] == [0, 3]  # one per window kind keeps the real (8, 128) shape
    assert probe["last_query_keys"]["native decode 3/3"]["sliding"] == [4096]
    assert not [f for f in real["olmo3"]["findings"] if f["severity"] != "info"]


def test_divergence_is_quiet_when_the_context_fits_the_window(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: sglang-mlx\ncontext_length: 4096\n")
    rc, doc = check_json(str(REAL / SHORT["mistral-7b"]), "--deploy", str(deploy), "--static")
    assert rc == 0 and "SWA005" not in codes(doc)
    deploy.write_text("engine: sglang-mlx\ncontext_length: 8192\n")
    rc, doc = check_json(str(REAL / SHORT["mistral-7b"]), "--deploy", str(deploy), "--static")
    assert "SWA005" in codes(doc)


def test_static_mode_predicts_refusals_without_probes():
    rc, doc = check_json(str(REAL / SHORT["gemma-3-1b-it"]), str(REAL / SHORT["gpt-oss-20b"]),
                         "--engine", "sglang-mlx", "--static", "-j", "1")
    gpt = doc["results"][1]
    assert rc == 1 and "ENG004" in codes(doc, 0)
    assert "probe" not in gpt["info"]["sglang_mlx"]


def test_exaone4_starts_with_a_warning_then_fails_on_the_first_prefill(tmp_path):
    model = make_model(tmp_path, dict(EXAONE4), checkpoint=False, dirname="exaone4")
    rc, doc = check_json(str(model), "--engine", "sglang-mlx")
    assert rc == 1
    got = {f["code"]: f for f in doc["results"][0]["findings"]}
    assert got["ENG012"]["engine_error"] == {"class": "AttributeError", "stage": "prefill",
                                             "message": "'MLXAttentionWrapper' object has no attribute 'is_local'"}
    assert got["ENG011"]["engine_error"]["message"].startswith("Model Model declares a sliding window but no per-layer")
    assert got["SWA005"]["evidence"]["layers"] == [0, 1, 2, 4, 5, 6]
    caches = [row["cache"] for row in doc["results"][0]["layers"]]
    assert caches == ["contiguous"] * 3 + ["native"] + ["contiguous"] * 3 + ["native"]  # global layers have no rope


def test_layer_types_missing_a_type_mlx_lm_looks_up_fails_at_load(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b", checkpoint=False,
                       edit=lambda cfg: cfg.update(layer_types=["sliding_attention"] * 24))
    rc, doc = check_json(str(model), "--engine", "sglang-mlx")
    f = finding(doc["results"][0], "ENG002")
    assert rc == 1 and f["engine_error"] == {"class": "ValueError", "message": "'full_attention' is not in list",
                                             "stage": "load"}
    assert doc["results"][0]["layers"][0]["cache"] is None  # nothing is built


def test_model_type_mlx_lm_lacks_fails_at_load(tmp_path):
    cfg = real_config("llama-3.1-8b")
    cfg["model_type"] = "llama_from_the_future"
    model = make_model(tmp_path, cfg, checkpoint=False, dirname="future")
    rc, doc = check_json(str(model), "--engine", "sglang-mlx")
    f = finding(doc["results"][0], "ENG001")
    assert rc == 1
    assert f["engine_error"] == {"class": "ValueError", "message": "Model type llama_from_the_future not supported.",
                                 "stage": "load"}


def test_mixed_key_projection_dtypes_are_refused(tmp_path):
    def f32_layer_5(layout):
        name = "model.layers.5.self_attn.k_proj.weight"
        layout[name] = ("F32", layout[name][1])

    model = make_model(tmp_path, "llama-3.1-8b", tensors=f32_layer_5)
    rc, doc = check_json(str(model), "--engine", "sglang-mlx", "--static")
    f = finding(doc["results"][0], "ENG005")
    assert rc == 1 and f["layer"] == 5 and f["file"] == "model.safetensors"
    assert f["engine_error"]["message"] == (
        "MLX attention KV caching requires uniform softmax-attention KV shape across layers. Layer 0 has "
        "(8, 128, mlx.core.bfloat16), but layer 5 has (8, 128, mlx.core.float32). Heterogeneous attention KV "
        "needs per-layer pools.")
    healthy = make_model(tmp_path, "llama-3.1-8b", dirname="healthy")
    rc, doc = check_json(str(healthy), "--engine", "sglang-mlx", "--static")
    assert rc == 0 and "ENG005" not in codes(doc)


def test_short_layer_types_leave_layers_unrun(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b", checkpoint=False,
                       edit=lambda cfg: cfg.update(layer_types=cfg["layer_types"][:22]))
    rc, doc = check_json(str(model), "--engine", "sglang-mlx")
    r = doc["results"][0]
    assert rc == 1
    unrun = finding(r, "ENG009")
    assert unrun["severity"] == "warning" and unrun["evidence"]["never_run"] == [22, 23]
    offsets = finding(r, "SWA004")
    assert offsets["severity"] == "error" and "extend" in offsets["message"]
    assert {22: 0, 23: 0}.items() <= {int(k): v for k, v in offsets["evidence"]["offsets"].items()}.items()


def test_json_info_carries_both_index_maps(real):
    info = real["gpt-oss-20b"]["info"]["sglang_mlx"]
    assert info["full_kv_pool_index_by_layer"] == {str(layer): i for i, layer in enumerate(range(1, 24, 2))}
    assert info["attention_pool_index_by_layer"] == {str(i): i for i in range(24)}
    assert info["fused_rope_pool_scatter"]["eligible"] is False and "YarnRoPE" in info["fused_rope_pool_scatter"]["why"]
    assert info["shared_pool"] is False  # sliding layers: sglang 0.5.23 skips the pool
    json.dumps(info)


def test_a_window_too_large_to_probe_is_skipped_with_lim001(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b", checkpoint=False, edit=lambda cfg: cfg.update(sliding_window=10**7))
    rc, doc = check_json(str(model), "--engine", "sglang-mlx", "--select", "SWA,ENG,LIM")
    r = doc["results"][0]
    assert codes(doc) == ["LIM001"] and "probe" not in r["info"]["sglang_mlx"]
    assert {row["engine_window"] for row in r["layers"] if row["cache"] == "windowed"} == {10**7}
