"""Falcon-H1 in the vLLM profile: two KV specs per decoder layer (falcon_h1.py registers the attention at the layer's
index and its parallel Mamba-2 mixer at num_hidden_layers + index), and VLM209, the chunked-prefill assertion a
Mamba model meets with prefix caching on. Figures from vLLM 0.34.0's own start-up (docs/vllm.md, set 9 / step 1)."""
from __future__ import annotations

import json
from pathlib import Path

from kvdoctor.engines.vllm.profile import plan
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.load.loader import load_model

FRESH = Path(__file__).resolve().parent.parent / "fixtures" / "configs" / "fresh"


def _falcon_h1(tmp_path: Path, **edits) -> object:
    cfg = json.loads((FRESH / "tiiuae__Falcon-H1-0.5B.json").read_text())
    cfg["mamba_d_ssm"] = cfg["mamba_n_heads"] * cfg["mamba_d_head"]  # the bridge's export; FalconH1Config's 1024 fails
    cfg.update(edits)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_model(str(tmp_path), library_check=False)


def test_each_layer_gets_an_attention_spec_and_a_mamba_spec(tmp_path):
    got = plan(_falcon_h1(tmp_path), VllmSettings(kv_budget="40GiB"))
    assert not got.refusals and got.facts.unmodeled is None
    specs = {layer.index: layer.extra["engine_spec"] for layer in got.layers}
    assert specs == {**{i: "FullAttentionSpec" for i in range(36)}, **{36 + i: "MambaSpec" for i in range(36)}}
    mamba = next(layer for layer in got.layers if layer.index == 36)
    assert mamba.extra["state_shapes"] == [[3, 1792], [24, 64, 128]]  # conv: 1536 + 2 x 1 x 128; ssm in bf16
    assert {(g.spec, g.layer_ids) for g in got.facts.groups} == {
        ("FullAttentionSpec", tuple(range(36))), ("MambaSpec", tuple(range(36, 72)))}


def test_tp_splits_the_mixer_and_the_kv_heads(tmp_path):
    got = plan(_falcon_h1(tmp_path), VllmSettings(kv_budget="40GiB", tensor_parallel_size=4))
    mamba = next(layer for layer in got.layers if layer.index == 40)
    assert mamba.extra["state_shapes"] == [[3, 640], [6, 64, 128]]
    assert [layer.extra["num_kv_heads"] for layer in got.layers if layer.index == 0] == [1]  # 2 KV heads, 4 ranks


def test_hma_off_cannot_unify_attention_and_mamba(tmp_path):
    got = plan(_falcon_h1(tmp_path), VllmSettings(kv_budget="40GiB", disable_hybrid_kv_cache_manager=True))
    assert [r.message for r in got.refusals] == ["Failed to promote local KV cache specs to one unified type."]


def test_chunked_prefill_off_is_refused_while_prefix_caching_is_on(tmp_path):
    spec = _falcon_h1(tmp_path)
    got = plan(spec, VllmSettings(kv_budget="40GiB", enable_chunked_prefill=False, max_model_len=4096))
    assert [(r.code, r.message) for r in got.refusals] == [
        ("VLM209", "Chunked prefill is required for Mamba prefix caching.")]
    twin = plan(spec, VllmSettings(kv_budget="40GiB", enable_chunked_prefill=False, max_model_len=4096,
                                   enable_prefix_caching=False))
    assert not twin.refusals
    older = plan(spec, VllmSettings(kv_budget="40GiB", enable_chunked_prefill=False,
                                    max_model_len=4096).at_release("0.32.0"))
    assert [r.message for r in older.refusals] == ["Chunked prefill is required for mamba cache mode 'align'."]
