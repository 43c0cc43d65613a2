"""POOL001-POOL003: the full-attention pool index map under the fused RoPE + pool-scatter kernel, with
real pool buffers and an emulated scatter (kvdoctor.engines.sglang_mlx.pool)."""
from __future__ import annotations

import pytest

from helpers import REAL, SHORT, check_json, codes, make_model
from kvdoctor.engines.sglang_mlx.pool import probe_pool

SEED_001 = ("BatchedDecodeContext requires full_kv_pool_index_by_layer when the fused AOT RoPE + pool-scatter "
            "kernel is active")
GPT_OSS_FULL = list(range(1, 24, 2))


def scatter(index_map, full=GPT_OSS_FULL):
    return probe_pool(full, index_map, n_kv_heads=8, head_dim=64, dtype="bfloat16", rope_dims=64,
                      rope_base=150000.0, slots=64)


def test_layout_map_writes_every_layer_into_its_own_buffer():
    readback = scatter({layer: i for i, layer in enumerate(GPT_OSS_FULL)})
    assert readback.clean and readback.buffers == 12 and readback.slots == 64


def test_cache_index_overwrites_other_layers_and_runs_past_the_end():
    readback = scatter({layer: layer for layer in GPT_OSS_FULL})
    assert readback.overwrites[0] == {"writer": 1, "buffer": 1, "owner": 3}
    assert {"writer": 11, "buffer": 11, "owner": 23} in readback.overwrites
    assert [p["layer"] for p in readback.past_end] == list(range(13, 24, 2))
    assert 1 in readback.unwritten  # layer 1's own buffer never got its new token


def test_missing_and_negative_entries():
    full = [1, 3, 5]
    readback = scatter({1: 0, 3: -1}, full=full)  # -1 wraps to the last buffer (layer 5's); 5 has no entry
    assert readback.missing == [5]
    assert readback.overwrites == [{"writer": 3, "buffer": 2, "owner": 5}]


@pytest.fixture()
def plain_rope_gpt_oss(tmp_path):
    """gpt-oss-20b without YaRN: plain RoPE over the whole head, so the fused kernel can build."""
    return make_model(tmp_path, "gpt-oss-20b", checkpoint=False, edit=lambda cfg: cfg.update(rope_scaling=None))


def deploy_file(tmp_path, **settings) -> str:
    lines = ["engine: sglang-mlx", "sglang_mlx:"]
    lines += [f"  {key}: {value}" for key, value in settings.items()]
    path = tmp_path / "deploy.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def pool_findings(model, deploy):
    rc, doc = check_json(str(model), "--deploy", deploy, "--select", "POOL")
    return rc, doc["results"][0]


def test_fused_kernel_without_a_map_is_pool001(tmp_path, plain_rope_gpt_oss):
    rc, result = pool_findings(plain_rope_gpt_oss,
                               deploy_file(tmp_path, use_custom_rope="true", full_kv_pool_index_by_layer="{}"))
    assert rc == 1 and codes({"results": [result]}) == ["POOL001"]
    f = result["findings"][0]
    assert f["engine_error"] == {"class": "ValueError", "message": SEED_001, "stage": "decode"}
    assert "layer 1 would overwrite layer 3's buffer" in f["message"]
    assert "layers 13..23 would index past the 12 buffers" in f["message"]
    assert "builds no pool for a model with sliding layers" in f["message"]
    assert f["file"].endswith("deploy.yaml") and f["line"] == 4 and f["layer"] == 1
    assert f["evidence"]["expected_map"] == {str(layer): i for i, layer in enumerate(GPT_OSS_FULL)}


@pytest.mark.parametrize("settings", [
    {"use_custom_rope": "true"},  # the layout's own map
    {"use_custom_rope": "false", "full_kv_pool_index_by_layer": "{}"},  # kernel off: the map is not used
    {"use_custom_rope": "true", "radix_cache": "false", "full_kv_pool_index_by_layer": "{}"},  # no pool
])
def test_no_pool001_when_the_map_is_there_or_unused(tmp_path, plain_rope_gpt_oss, settings):
    rc, result = pool_findings(plain_rope_gpt_oss, deploy_file(tmp_path, **settings))
    assert rc == 0 and result["findings"] == []


def test_layout_map_is_scattered_and_read_back_clean(tmp_path, plain_rope_gpt_oss):
    rc, result = pool_findings(plain_rope_gpt_oss, deploy_file(tmp_path, use_custom_rope="true"))
    assert rc == 0 and result["info"]["sglang_mlx"]["pool_probe"] == {"map": "derived from the layout", "clean": True,
                                                          "slots": 64}
    assert result["info"]["sglang_mlx"]["fused_rope_pool_scatter"]["active"] is True


def test_scaled_rope_keeps_the_kernel_off(tmp_path):
    rc, result = pool_findings(REAL / SHORT["gpt-oss-20b"],
                               deploy_file(tmp_path, use_custom_rope="true", full_kv_pool_index_by_layer="{}"))
    assert rc == 0 and result["findings"] == []
    assert "not used" in " ".join(result["info"]["engine_notes"])


def test_all_full_model_still_needs_the_map(tmp_path):
    rc, result = pool_findings(REAL / SHORT["mistral-7b"],
                               deploy_file(tmp_path, use_custom_rope="true", full_kv_pool_index_by_layer="{}"))
    f = result["findings"][0]
    assert rc == 1 and f["code"] == "POOL001" and "happen to address the right buffers here" in f["message"]
    assert "builds no pool" not in f["message"]  # no sliding layers: sglang 0.5.23 keeps the pool


def test_a_supplied_map_pointing_at_other_buffers(tmp_path, plain_rope_gpt_oss):
    identity = "{" + ", ".join(f"{layer}: {layer}" for layer in GPT_OSS_FULL) + "}"
    rc, result = pool_findings(plain_rope_gpt_oss,
                               deploy_file(tmp_path, use_custom_rope="true", full_kv_pool_index_by_layer=identity))
    got = {f["code"]: f for f in result["findings"]}
    assert rc == 1 and set(got) == {"POOL002", "POOL003"}
    assert "layer 1 would overwrite layer 3's buffer" in got["POOL002"]["message"]
    assert got["POOL003"]["evidence"]["past_end"][0] == {"layer": 13, "index": 13}


def test_a_supplied_map_missing_a_layer(tmp_path, plain_rope_gpt_oss):
    partial = "{" + ", ".join(f"{layer}: {i}" for i, layer in enumerate(GPT_OSS_FULL[:-1])) + "}"
    rc, result = pool_findings(plain_rope_gpt_oss,
                               deploy_file(tmp_path, use_custom_rope="true", full_kv_pool_index_by_layer=partial))
    assert rc == 1 and codes({"results": [result]}) == ["POOL003"]
    assert result["findings"][0]["evidence"]["missing"] == [23] and result["findings"][0]["layer"] == 23
