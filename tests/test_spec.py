"""The per-layer spec of every real config, family defaults, and where each value came from."""
from __future__ import annotations

import json

import pytest

from helpers import REAL, REAL_NAMES, ROOT, check_json, make_model, real_config
from kvdoctor.load.families import FAMILIES
from kvdoctor.load.loader import load_model
from kvdoctor.model import FULL, KDA, MLA, SLIDING, GDN, MAMBA, ATTN_MAMBA, NO_ATTENTION

ROOT_REAL = ROOT / "fixtures" / "configs" / "real"


def kinds(spec):
    return [layer.kind for layer in spec.layers]


@pytest.mark.parametrize("name", REAL_NAMES)
def test_every_real_config_gives_one_layer_per_hidden_layer(name):
    code, doc = check_json(str(REAL / name))
    result = doc["results"][0]
    cfg = json.loads((REAL / name / "config.json").read_text())
    assert code in (0, 1), result.get("error")
    assert len(result["layers"]) == cfg["num_hidden_layers"]
    assert [row["index"] for row in result["layers"]] == list(range(cfg["num_hidden_layers"]))
    for row in result["layers"]:
        assert set(row) >= {"index", "kind", "window", "engine_window", "cache"}
        assert row["kind"] != "unknown"
        assert row["engine_window"] == row["window"]  # engine hf: the model's own meaning


def test_gpt_oss_alternates_sliding_128_and_full():
    spec = load_model(str(REAL / "openai__gpt-oss-20b"))
    assert len(spec.layers) == 24
    assert kinds(spec) == [SLIDING, FULL] * 12
    assert [layer.window for layer in spec.layers] == [128, None] * 12
    assert spec.layers[0].sources["window"].ref == "sliding_window"
    assert spec.layers[0].sources["window"].line == spec.key_lines["sliding_window"]


def test_gemma3_1b_every_sixth_layer_full_window_512():
    spec = load_model(str(REAL / "google__gemma-3-1b-it"))
    assert len(spec.layers) == 26
    full = [layer.index for layer in spec.layers if layer.kind == FULL]
    assert full == [5, 11, 17, 23]
    assert {layer.window for layer in spec.layers if layer.kind == SLIDING} == {512}


def test_gemma3_pattern_default_is_used_and_reported(tmp_path):
    """The published gemma-3 config.json omits sliding_window_pattern: transformers' default 6 applies."""
    d = make_model(tmp_path, "gemma-3-1b-it", checkpoint=False,
                   edit=lambda c: c.pop("sliding_window_pattern"))
    spec = load_model(str(d))
    assert [layer.index for layer in spec.layers if layer.kind == FULL] == [5, 11, 17, 23]
    assert spec.defaults == {"sliding_window_pattern": 6}
    assert spec.layers[0].sources["kind"].kind == "default"
    _, doc = check_json(str(d))
    assert doc["results"][0]["info"]["defaults"] == {"sliding_window_pattern": 6}


def test_kimi_linear_lists_are_one_indexed():
    spec = load_model(str(REAL / "moonshotai__Kimi-Linear-48B-A3B-Instruct"))
    assert len(spec.layers) == 27
    assert kinds(spec).count(KDA) == 20 and kinds(spec).count(MLA) == 7
    # full_attn_layers [4, 8, ..., 24, 27] are 1-indexed: layers 3, 7, ..., 23, 26
    assert [layer.index for layer in spec.layers if layer.kind == MLA] == [3, 7, 11, 15, 19, 23, 26]
    kda = spec.layers[0]
    assert (kda.n_heads, kda.head_dim, kda.v_head_dim) == (32, 128, 128)
    assert kda.sources["kind"].ref == "linear_attn_config.kda_layers"
    mla = spec.layers[3]
    assert mla.head_dim == 128 + 64 and mla.v_head_dim == 128


def test_llama_all_full_and_mistral_window_everywhere():
    assert set(kinds(load_model(str(REAL / "meta-llama__Llama-3.1-8B")))) == {FULL}
    mistral = load_model(str(REAL / "mistralai__Mistral-7B-v0.1"))
    assert set(kinds(mistral)) == {SLIDING} and {layer.window for layer in mistral.layers} == {4096}


def test_qwen2_window_disabled_by_use_sliding_window():
    spec = load_model(str(REAL / "Qwen__Qwen2.5-7B-Instruct"))
    assert set(kinds(spec)) == {FULL}


def test_qwen2_window_from_max_window_layers(tmp_path):
    d = make_model(tmp_path, "qwen2.5-7b", checkpoint=False,
                   edit=lambda c: c.update(use_sliding_window=True, sliding_window=4096, max_window_layers=20))
    spec = load_model(str(d))
    assert kinds(spec) == [FULL] * 20 + [SLIDING] * 8


def test_qwen3_next_gated_deltanet_with_every_fourth_full():
    spec = load_model(str(REAL / "Qwen__Qwen3-Next-80B-A3B-Instruct"))
    assert [layer.index for layer in spec.layers if layer.kind == FULL] == list(range(3, 48, 4))
    assert kinds(spec).count(GDN) == 36


def test_olmo3_three_sliding_one_full():
    spec = load_model(str(REAL / "allenai__Olmo-3.1-32B-Instruct"))
    assert kinds(spec)[:8] == [SLIDING, SLIDING, SLIDING, FULL] * 2
    assert {layer.window for layer in spec.layers if layer.kind == SLIDING} == {4096}


SYNTHETIC = {
    # model_type -> (config, expected kinds); built from each family's transformers defaults
    "exaone4": ({"num_hidden_layers": 8, "sliding_window": 4096, "sliding_window_pattern": "LLLG"},
                [SLIDING, SLIDING, SLIDING, FULL] * 2),
    "cohere2": ({"num_hidden_layers": 8}, [SLIDING, SLIDING, SLIDING, FULL] * 2),
    "gemma2": ({"num_hidden_layers": 4}, [SLIDING, FULL] * 2),
    "qwen3": ({"num_hidden_layers": 4}, [FULL] * 4),
    "phi3": ({"num_hidden_layers": 4}, [FULL] * 4),
    "jamba": ({"num_hidden_layers": 16}, [MAMBA] * 4 + [FULL] + [MAMBA] * 7 + [FULL] + [MAMBA] * 3),
    "nemotron_h": ({"num_hidden_layers": 6, "hybrid_override_pattern": "M-M*-E"},
                   [MAMBA, NO_ATTENTION, MAMBA, FULL, NO_ATTENTION, NO_ATTENTION]),
    "falcon_h1": ({"num_hidden_layers": 3}, [ATTN_MAMBA] * 3),
}


@pytest.mark.parametrize("model_type", sorted(SYNTHETIC))
def test_families_without_a_real_config(tmp_path, model_type):
    extra, expected = SYNTHETIC[model_type]
    cfg = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000, **extra}
    d = make_model(tmp_path, cfg, checkpoint=False)
    assert kinds(load_model(str(d))) == expected


def test_unknown_model_type_gets_best_effort_spec_and_info(tmp_path):
    cfg = {"model_type": "brand_new", "num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 64,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 32}
    d = make_model(tmp_path, cfg, checkpoint=False)
    code, doc = check_json(str(d))
    assert code == 0
    assert [row["kind"] for row in doc["results"][0]["layers"]] == [SLIDING, FULL, SLIDING]
    assert "CFG009" in [f["code"] for f in doc["results"][0]["findings"]]


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.defaults], ids=lambda f: f.name)
def test_family_defaults_match_transformers(family):
    """Our default table is a fact about transformers: compare it with the installed classes."""
    transformers = pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING

    # the newest spelling the installed transformers registers (EXAONE 4.5's exaone4_5_text is renamed
    # to exaone4 by its wrapper class and has no entry of its own)
    model_type = next(t for t in reversed(family.model_types) if t in CONFIG_MAPPING)
    cls = CONFIG_MAPPING[model_type]
    config = cls()
    fields = getattr(cls, "__dataclass_fields__", {})
    for key, value in family.defaults.items():
        if key in fields:
            assert fields[key].default == value, (transformers.__version__, model_type, key)
        elif key in ("sliding_window_pattern", "full_attention_interval"):
            # a constructor keyword, not a field: check the layer pattern it produces instead
            pattern = [t == "full_attention" for t in config.layer_types]
            assert pattern.index(True) + 1 == value, (model_type, key)
        else:
            assert getattr(cls, key) == value, (model_type, key)


def test_text_config_is_used_for_multimodal_wrappers(tmp_path):
    inner = real_config("gemma-3-1b-it")
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": inner}
    d = make_model(tmp_path, cfg, checkpoint=False)
    spec = load_model(str(d))
    assert spec.model_type == "gemma3_text" and spec.config_prefix == "text_config."
    assert spec.layers[0].sources["window"].ref == "text_config.sliding_window"
    assert spec.layers[0].sources["window"].line is not None


def test_dtype_comes_from_the_checkpoint(tmp_path):
    d = make_model(tmp_path, "llama-3.1-8b")
    spec = load_model(str(d))
    assert spec.layers[0].dtype == "BF16"
    assert spec.layers[0].sources["dtype"].kind == "tensor"


def test_hf_id_resolves_in_local_cache_offline(tmp_path):
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny"
    snap = repo / "snapshots" / "abc123"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (blobs / "cfg").write_text(json.dumps(real_config("llama-3.1-8b")))
    (snap / "config.json").symlink_to("../../blobs/cfg")
    code, doc = check_json("acme/tiny", env={"HF_HUB_CACHE": str(cache)})
    assert code == 0, doc
    assert doc["results"][0]["model_type"] == "llama"
    code, doc = check_json("acme/absent", env={"HF_HUB_CACHE": str(cache)})
    assert code == 2


@pytest.mark.parametrize("multi_query, kv_heads, kv_key", [(True, 2, "multi_query_group_num"),
                                                          (False, 32, "num_attention_heads")])
def test_chatglm_keys_are_read_as_vllms_config_class_spells_them(tmp_path, multi_query, kv_heads, kv_key):
    """ChatGLM2 (vLLM's own ChatGLMConfig; transformers has none): num_layers, kv_channels, and KV heads
    from multi_query_group_num only with multi-query attention; each value's source is the key read."""
    cfg = json.loads((ROOT_REAL / "THUDM__chatglm2-6b.json").read_text())
    cfg["multi_query_attention"] = multi_query
    spec = load_model(str(make_model(tmp_path, cfg, checkpoint=False)))
    assert (spec.family, spec.num_hidden_layers, spec.semantics) == ("chatglm", 28, "table")
    assert {(layer.kind, layer.n_kv_heads, layer.head_dim) for layer in spec.layers} == {(FULL, kv_heads, 128)}
    assert spec.layers[0].sources["n_kv_heads"].ref == kv_key
    assert spec.layers[0].sources["head_dim"].ref == "kv_channels"
