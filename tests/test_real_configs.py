"""The real-config corpus (fixtures/configs/real): every published config loads as a config-only dir,
draws no error-level finding, and, wherever the installed transformers knows its model type, has the
per-layer kinds and windows transformers' own configuration class gives."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from helpers import ROOT, check_json
from kvdoctor.load.loader import load_model
from kvdoctor.model import (ATTN_MAMBA, CHUNKED, COMPRESSED, CONV, FULL, GDN, KDA, LINEAR, MAMBA, MLA,
                            NO_ATTENTION, SLIDING, SPARSE_MLA)

CORPUS = ROOT / "fixtures" / "configs" / "real"
NAMES = sorted(p.stem for p in CORPUS.glob("*.json"))
# transformers' layer_types strings (after its legacy renames) -> the kvdoctor kinds each may be.
TRANSFORMERS_KINDS = {
    "full_attention": {FULL, MLA}, "sliding_attention": {SLIDING}, "chunked_attention": {CHUNKED},
    "linear_attention": {GDN, KDA, MAMBA, LINEAR}, "conv": {CONV}, "mlp": {NO_ATTENTION}, "moe": {NO_ATTENTION},
    "hybrid": {ATTN_MAMBA}, "indexed_attention": {SPARSE_MLA},
    "compressed_sparse_attention": {COMPRESSED}, "heavily_compressed_attention": {COMPRESSED},
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real")
    out = {}
    for name in NAMES:
        d = root / name
        d.mkdir()
        (d / "config.json").write_bytes((CORPUS / f"{name}.json").read_bytes())
        out[name] = d
    return out


@pytest.fixture(scope="module")
def report(dirs) -> dict[str, dict]:
    """One `check --static` run over the whole corpus (one process: the imports are paid once)."""
    code, doc = check_json("--static", *(str(d) for d in dirs.values()))
    assert code in (0, 1), doc
    return {Path(r["target"]).name: r for r in doc["results"]}


def test_corpus_is_large_and_every_file_has_a_source():
    sources = (CORPUS / "SOURCES.md").read_text()
    assert len(NAMES) >= 40
    missing = [n for n in NAMES if f"`{n}.json`" not in sources]
    assert not missing, missing


@pytest.mark.parametrize("name", NAMES)
def test_loads_with_no_error_level_finding(report, name):
    result = report[name]
    assert result.get("error") is None, result.get("error")
    errors = [f"{f['code']}: {f['message']}" for f in result["findings"] if f["severity"] == "error"]
    assert not errors
    assert "unknown" not in {row["kind"] for row in result["layers"]}


def _transformers_view(spec):
    """(layer kinds, sliding window, chunk size, layer count, MLA?) from the installed transformers
    configuration class, or None when it does not know the model type."""
    transformers = pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING

    if spec.model_type not in CONFIG_MAPPING:
        return None
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = CONFIG_MAPPING[spec.model_type](**{k: v for k, v in json.loads(json.dumps(spec.config)).items()
                                                 if k != "model_type"})
    if not hasattr(obj, "num_hidden_layers"):  # a composite class (Qwen2.5-VL) holds them in its text config
        obj = obj.get_text_config()
    n = obj.num_hidden_layers
    types = getattr(obj, "layer_types", None)
    if types is None:  # no per-layer list: a set window applies to every layer (Mistral semantics)
        types = ["sliding_attention" if getattr(obj, "sliding_window", None) else "full_attention"] * n
    return (list(types), getattr(obj, "sliding_window", None), getattr(obj, "attention_chunk_size", None), n,
            getattr(obj, "kv_lora_rank", None) is not None)


@pytest.mark.parametrize("name", NAMES)
def test_kinds_and_windows_match_transformers(dirs, name):
    spec = load_model(str(dirs[name]), with_checkpoint=False)
    view = _transformers_view(spec)
    if view is None:
        pytest.skip(f"transformers has no class for {spec.model_type!r}")
    types, window, chunk, n, mla = view
    assert len(spec.layers) == n == len(types)
    for layer, hf_type in zip(spec.layers, types):
        assert layer.kind in TRANSFORMERS_KINDS[hf_type], (layer.index, layer.kind, hf_type)
        if mla and hf_type == "full_attention":
            assert layer.kind == MLA, (layer.index, layer.kind)
        if layer.kind == SLIDING:
            assert layer.window == window, (layer.index, layer.window, window)
        elif layer.kind == CHUNKED:
            assert layer.window == chunk, (layer.index, layer.window, chunk)
        else:
            assert layer.window is None or layer.kind == COMPRESSED


def test_the_corpus_covers_the_kinds_engines_size_differently(dirs):
    kinds = set()
    for d in dirs.values():
        kinds |= {layer.kind for layer in load_model(str(d), with_checkpoint=False).layers}
    assert {FULL, SLIDING, CHUNKED, MLA, SPARSE_MLA, COMPRESSED, CONV, NO_ATTENTION, MAMBA, GDN, KDA} <= kinds


def _spec(dirs, name):
    return load_model(str(dirs[name]), with_checkpoint=False)


def test_deepseek_v3_is_mla_with_latent_512_and_rope_64(dirs):
    spec = _spec(dirs, "deepseek-ai__DeepSeek-V3")
    assert {l.kind for l in spec.layers} == {MLA} and len(spec.layers) == 61
    layer = spec.layers[0]
    assert (layer.kv_lora_rank, layer.qk_rope_head_dim, layer.head_dim) == (512, 64, 192)
    assert layer.sources["kv_lora_rank"].line == spec.key_lines["kv_lora_rank"]


def test_deepseek_v32_has_an_indexer(dirs):
    layer = _spec(dirs, "deepseek-ai__DeepSeek-V3.2").layers[5]
    assert layer.kind == SPARSE_MLA and (layer.index_head_dim, layer.index_topk) == (128, 2048)


def test_llama4_scout_chunked_with_every_fourth_layer_full(dirs):
    spec = _spec(dirs, "meta-llama__Llama-4-Scout-17B-16E-Instruct")
    assert [l.index for l in spec.layers if l.kind == FULL] == list(range(3, 48, 4))
    assert {l.window for l in spec.layers if l.kind == CHUNKED} == {8192}


def test_lfm2_conv_layers_keep_a_kernel_not_a_kv_cache(dirs):
    spec = _spec(dirs, "LiquidAI__LFM2.5-VL-1.6B")
    conv = [l for l in spec.layers if l.kind == CONV]
    assert len(conv) == 10 and {l.conv_kernel for l in conv} == {3} and conv[0].n_kv_heads is None


def test_nemotron_nas_blocks_are_heterogeneous(dirs):
    spec = _spec(dirs, "nvidia__Llama-3_3-Nemotron-Super-49B-v1")
    assert sum(l.kind == NO_ATTENTION for l in spec.layers) == 31
    assert {l.n_kv_heads for l in spec.layers if l.kind == FULL} == {8}  # 64 heads / n_heads_in_group 8


def test_nemotron_h_with_infinity_and_without_num_hidden_layers(dirs):
    spec = _spec(dirs, "nvidia__Nemotron-H-56B-Base-8K")  # "time_step_limit": [0.0, Infinity]
    assert len(spec.layers) == 118
    ultra = _spec(dirs, "nvidia__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16")
    assert "num_hidden_layers" not in ultra.config
    assert len(ultra.layers) == len(ultra.config["layers_block_type"]) == 108


# Synthetic configs for every table family transformers also knows: the table must give the layers
# transformers' class derives (the corpus above covers the families' published configs).
TABLE_CASES = {
    "llama": {}, "mistral": {"sliding_window": 64}, "phi3": {"sliding_window": 64}, "qwen2": {},
    "qwen3": {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 4},
    "gemma2": {}, "gemma3_text": {"sliding_window_pattern": 3}, "gpt_oss": {}, "olmo3": {},
    "exaone4": {"sliding_window_pattern": 3}, "cohere2": {"sliding_window_pattern": 3},
    "kimi_linear": {"linear_attn_config": {"kda_layers": [1, 2, 4, 5, 6, 8], "full_attn_layers": [3, 7],
                                           "num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4}},
    "qwen3_next": {"full_attention_interval": 2}, "qwen3_5_text": {}, "qwen3_5_moe_text": {},
    "nemotron_h": {"hybrid_override_pattern": "M-M*-EM*"}, "jamba": {"attn_layer_period": 4, "attn_layer_offset": 1},
    "falcon_h1": {}, "deepseek_v2": {}, "deepseek_v3": {}, "deepseek_v32": {}, "glm_moe_dsa": {},
    "llama4_text": {"no_rope_layer_interval": 3, "attention_chunk_size": 256}, "lfm2": {"full_attn_idxs": [2, 5]},
}


@pytest.mark.parametrize("model_type", sorted(TABLE_CASES))
def test_table_families_agree_with_transformers(tmp_path, model_type):
    from kvdoctor.load.families import family_for

    assert family_for(model_type) is not None and family_for(model_type).semantics == "table"
    cfg = {"model_type": model_type, "num_hidden_layers": 8, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 1000, **TABLE_CASES[model_type]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model(str(tmp_path), with_checkpoint=False)
    view = _transformers_view(spec)
    assert view is not None, model_type
    types, window, chunk, n, mla = view
    assert len(spec.layers) == n
    got = [layer.kind for layer in spec.layers]
    assert all(kind in TRANSFORMERS_KINDS[t] for kind, t in zip(got, types)), (got, types)
    assert all(layer.window == window for layer in spec.layers if layer.kind == SLIDING)
    assert all(layer.window == chunk for layer in spec.layers if layer.kind == CHUNKED)
    assert mla == any(layer.kind in (MLA, SPARSE_MLA) for layer in spec.layers)


def test_the_hidden_size_validators_kvdoctor_quotes_are_transformers_own():
    """CFG015 is an error exactly for the table families whose class validates hidden % heads."""
    pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING

    from kvdoctor.checks.cfg_semantics import VALIDATES_HIDDEN
    from kvdoctor.load.families import FAMILIES

    for model_type in sorted({mt for fam in FAMILIES for mt in fam.model_types} & set(CONFIG_MAPPING)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                CONFIG_MAPPING[model_type](hidden_size=260, num_attention_heads=8, num_key_value_heads=8)
                raised = False
            except Exception as exc:  # noqa: BLE001
                raised = "is not a multiple of the number of attention heads" in str(exc)
        assert raised == (model_type in VALIDATES_HIDDEN), model_type


def test_the_layer_type_strings_kvdoctor_accepts_are_transformers_own():
    pytest.importorskip("transformers")
    from transformers import configuration_utils

    from kvdoctor.load.families import TRANSFORMERS_LAYER_TYPES

    installed = set(configuration_utils.ALLOWED_ATTN_LAYER_TYPES) | set(configuration_utils._LEGACY_LAYER_TYPE_REMAP)
    assert TRANSFORMERS_LAYER_TYPES == installed


def test_a_string_transformers_accepts_but_kvdoctor_cannot_size_is_a_warning(tmp_path):
    cfg = {"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 1000,
           "layer_types": ["full_attention", "hybrid_sliding", "full_attention", "full_attention"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, doc = check_json("--static", str(tmp_path))
    findings = {f["code"]: f for f in doc["results"][0]["findings"]}
    assert code == 0 and "CFG002" not in findings
    assert findings["CFG011"]["severity"] == "warning" and findings["CFG011"]["layer"] == 1


def test_values_a_family_derives_say_so(dirs):
    """MiMo-V2-Flash configures sliding_window 128 and sliding_window_size 128; its class (and kvdoctor's
    family, which both installs read) makes the window 129 (keys including the query's own) and says why.
    Qwen3-VL's text config leaves sliding_window to its transformers class, and the source says so."""
    spec = _spec(dirs, "XiaomiMiMo__MiMo-V2-Flash")
    assert spec.semantics == "table" and spec.config["sliding_window"] == 128
    sliding = next(l for l in spec.layers if l.kind == SLIDING)
    assert sliding.window == 129
    src = sliding.sources["window"]
    assert src.kind == "derived" and src.ref == "sliding_window_size + 1"
    assert src.line == spec.key_lines["sliding_window_size"]
    assert sliding.sources["kind"].kind == "default"
    spec = _spec(dirs, "Qwen__Qwen3-VL-30B-A3B-Instruct")
    if spec.semantics == "transformers":  # only where transformers is installed
        refs = {s.ref for layer in spec.layers for s in layer.sources.values() if s.kind == "transformers"}
        assert any("sliding_window (default, transformers" in ref for ref in refs), refs

def _drop(*keys):
    return lambda cfg: {k: v for k, v in cfg.items() if k not in keys}


# kvdoctor's own families for model types transformers 5.25 also reads (so the base install, without
# transformers, reads them the same way): each real config, and each with the keys the family falls back on
# removed (DeepSeek-V4 without compress_ratios takes the class's default pattern; MiMo-V2 without
# sliding_window_size keeps sliding_window as set, without both takes the class's default window).
OWN_FAMILY_CASES = {
    "v4-pro": ("deepseek-ai__DeepSeek-V4-Pro", _drop()),
    "v4-flash": ("deepseek-ai__DeepSeek-V4-Flash", _drop()),
    "v4-no-ratios": ("deepseek-ai__DeepSeek-V4-Flash", _drop("compress_ratios")),
    "v4-defaults": ("deepseek-ai__DeepSeek-V4-Flash", _drop("compress_ratios", "sliding_window", "head_dim",
                                                             "num_attention_heads", "num_key_value_heads")),
    "mimo-v2": ("XiaomiMiMo__MiMo-V2-Flash", _drop()),
    "mimo-v2-no-size": ("XiaomiMiMo__MiMo-V2-Flash", _drop("sliding_window_size")),
    "mimo-v2-defaults": ("XiaomiMiMo__MiMo-V2-Flash", _drop("sliding_window_size", "sliding_window", "head_dim",
                                                          "v_head_dim", "num_key_value_heads")),
}


@pytest.mark.parametrize("case", sorted(OWN_FAMILY_CASES))
def test_own_families_read_layers_as_transformers_does(tmp_path, case):
    """Every layer (kind, window, heads, widths) from kvdoctor's family equals what transformers' class
    gives the same config, read through the class as kvdoctor reads types it has no family for."""
    import msgspec

    from kvdoctor.load import hf_config
    from kvdoctor.load.families import ResolvedLookup, build_layers, family_for, transformers_family
    from kvdoctor.model import Source

    if not hf_config.installed():  # kvdoctor imports it its own way (torch hidden): not importorskip
        pytest.skip("transformers is not installed")

    name, edit = OWN_FAMILY_CASES[case]
    cfg = edit(json.loads((CORPUS / f"{name}.json").read_text()))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model(str(tmp_path), with_checkpoint=False)
    assert spec.semantics == "table" and family_for(spec.model_type) is not None
    view = hf_config.read(spec.model_type, cfg)
    assert view is not None, spec.model_type
    theirs = build_layers(transformers_family(view), ResolvedLookup(cfg, view, lambda k: Source("key", k)),
                          spec.num_hidden_layers)

    def shape(layer):
        return {k: v for k, v in msgspec.structs.asdict(layer).items() if k not in ("sources", "dtype")}

    assert [shape(layer) for layer in spec.layers] == [shape(layer) for layer in theirs]
    assert len({layer.kind for layer in spec.layers}) > 1 or case in ("v4-pro", "v4-no-ratios", "v4-defaults")
