"""Each CFG and CKPT rule fires on a broken fixture and stays quiet on the real configs with matching checkpoints."""
from __future__ import annotations

import json

import pytest

from helpers import SHORT, check_json, codes, make_model

STATIC = ("--select", "CFG,CKPT")


@pytest.mark.parametrize("name", sorted(SHORT))
def test_real_configs_with_matching_checkpoints_are_quiet(tmp_path, name):
    d = make_model(tmp_path, name, shards=3)
    code, doc = check_json(str(d), *STATIC)
    assert code == 0
    assert [c for c in codes(doc) if c != "CFG010"] == []  # CFG010 (info) only where auto_map is present


def fired(tmp_path, name, edit=None, tensors=None, shards=1, checkpoint=True):
    d = make_model(tmp_path, name, edit=edit, tensors=tensors, shards=shards, checkpoint=checkpoint)
    code, doc = check_json(str(d), *STATIC)
    return code, doc["results"][0]["findings"], d


def only(findings, code):
    return [f for f in findings if f["code"] == code]


def test_cfg001_layer_types_length(tmp_path):
    code, findings, _ = fired(tmp_path, "gpt-oss-20b", edit=lambda c: c["layer_types"].pop())
    [f] = only(findings, "CFG001")
    assert code == 1 and "23 layers" in f["message"] and "24" in f["message"]
    assert f["file"] == "config.json" and f["line"] is not None


def test_cfg002_unknown_layer_type(tmp_path):
    def edit(c):
        c["layer_types"][3] = "sliding_atention"
    _, findings, _ = fired(tmp_path, "gpt-oss-20b", edit=edit)
    [f] = only(findings, "CFG002")
    assert f["layer"] == 3 and "sliding_atention" in f["message"]


def test_cfg003_sliding_layers_with_null_window(tmp_path):
    _, findings, _ = fired(tmp_path, "gpt-oss-20b", edit=lambda c: c.update(sliding_window=None))
    [f] = only(findings, "CFG003")
    assert f["layer"] == 0 and f["evidence"]["layers"] == list(range(0, 24, 2))


def test_cfg003_sliding_layers_whose_window_is_switched_off(tmp_path):
    """Qwen1.5-MoE typed sliding everywhere without use_sliding_window: transformers' Qwen2MoeConfig gives its "no
    window" (0) and the layers are read with none; with use_sliding_window on they keep the config's window."""
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
           "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "max_window_layers": 21,
           "sliding_window": 32768, "use_sliding_window": False, "layer_types": ["sliding_attention"] * 24}
    _, findings, _ = fired(tmp_path / "off", cfg, checkpoint=False)
    [f] = only(findings, "CFG003")
    assert "use_sliding_window is false" in f["message"] and f["evidence"]["layers"] == list(range(24))
    _, findings, _ = fired(tmp_path / "on", {**cfg, "use_sliding_window": True}, checkpoint=False)
    assert not only(findings, "CFG003")


def test_cfg004_window_without_sliding_layers(tmp_path):
    """The vaultgemma case: every layer full, a window still set."""
    _, findings, _ = fired(tmp_path, "gpt-oss-20b",
                           edit=lambda c: c.update(layer_types=["full_attention"] * 24))
    [f] = only(findings, "CFG004")
    assert f["severity"] == "warning" and "128" in f["message"]


def test_cfg004_quiet_when_window_explicitly_disabled(tmp_path):
    _, findings, _ = fired(tmp_path, "qwen2.5-7b")  # sliding_window 131072, use_sliding_window false
    assert only(findings, "CFG004") == []


def test_cfg005_pattern_disagrees_with_layer_types(tmp_path):
    def edit(c):
        c["layer_types"] = ["full_attention" if i % 6 == 0 else "sliding_attention" for i in range(26)]
    code, findings, _ = fired(tmp_path, "gemma-3-1b-it", edit=edit)
    [f] = only(findings, "CFG005")
    assert code == 1 and f["layer"] == 0


def test_cfg005_quiet_when_pattern_and_list_agree(tmp_path):
    def edit(c):
        c["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]
    _, findings, _ = fired(tmp_path, "gemma-3-1b-it", edit=edit)
    assert only(findings, "CFG005") == []


def test_cfg006_overlapping_kda_and_full_lists(tmp_path):
    _, findings, _ = fired(tmp_path, "kimi-linear",
                           edit=lambda c: c["linear_attn_config"]["kda_layers"].append(4))
    [f] = only(findings, "CFG006")
    assert f["layer"] == 3 and "layer 4" in f["message"]


def test_cfg007_gap_from_zero_indexed_lists(tmp_path):
    def edit(c):
        lac = c["linear_attn_config"]
        lac["kda_layers"] = [i - 1 for i in lac["kda_layers"]]
        lac["full_attn_layers"] = [i - 1 for i in lac["full_attn_layers"]]
    _, findings, _ = fired(tmp_path, "kimi-linear", edit=edit)
    gap = only(findings, "CFG007")
    out_of_range = only(findings, "CFG008")
    assert len(gap) == 1 and gap[0]["evidence"]["layers"] == [27]
    assert len(out_of_range) == 1 and out_of_range[0]["evidence"]["value"] == 0


def test_cfg008_layer_past_the_count(tmp_path):
    _, findings, _ = fired(tmp_path, "kimi-linear",
                           edit=lambda c: c["linear_attn_config"]["full_attn_layers"].append(28))
    [f] = only(findings, "CFG008")
    assert "outside 1..27" in f["message"]


def test_cfg010_auto_map_reported_as_info(tmp_path):
    code, findings, _ = fired(tmp_path, "phi3-mini")
    [f] = only(findings, "CFG010")
    assert f["severity"] == "info" and code == 0


def test_ckpt001_kv_heads_disagree_with_k_proj(tmp_path):
    code, findings, _ = fired(tmp_path, "llama-3.1-8b", edit=lambda c: c.update(num_key_value_heads=4))
    bad = only(findings, "CKPT001")
    assert code == 1
    assert {f["layer"] for f in bad} == set(range(32))
    assert any("k_proj" in f["message"] and "1024 rows" in f["message"] for f in bad)


def test_ckpt001_mla_latent_rank(tmp_path):
    _, findings, _ = fired(tmp_path, "kimi-linear", edit=lambda c: c.update(kv_lora_rank=256))
    bad = only(findings, "CKPT001")
    assert [f["layer"] for f in bad] == [3, 7, 11, 15, 19, 23, 26]


def test_ckpt002_layer_count(tmp_path):
    code, findings, _ = fired(tmp_path, "llama-3.1-8b", edit=lambda c: c.update(num_hidden_layers=34))
    [f] = only(findings, "CKPT002")
    assert code == 1 and f["evidence"]["missing_layers"] == [32, 33]
    _, findings, _ = fired(tmp_path / "b", "llama-3.1-8b", edit=lambda c: c.update(num_hidden_layers=30))
    [f] = only(findings, "CKPT002")
    assert f["evidence"]["extra_layers"] == [30, 31]


def test_ckpt003_vocab(tmp_path):
    _, findings, _ = fired(tmp_path, "llama-3.1-8b", edit=lambda c: c.update(vocab_size=128000))
    bad = only(findings, "CKPT003")
    assert {f["evidence"]["tensor"] for f in bad} == {"model.embed_tokens.weight", "lm_head.weight"}


def test_ckpt004_kda_heads_disagree(tmp_path):
    _, findings, _ = fired(tmp_path, "kimi-linear", edit=lambda c: c["linear_attn_config"].update(num_heads=16))
    bad = only(findings, "CKPT004")
    assert {f["layer"] for f in bad} == {i for i in range(27) if i not in (3, 7, 11, 15, 19, 23, 26)}
    assert any("b_proj" in f["message"] for f in bad) and any("A_log" in f["message"] for f in bad)


def test_ckpt004_value_dim_from_o_norm(tmp_path):
    def tensors(layout):
        for name in list(layout):
            if name.endswith("o_norm.weight"):
                layout[name] = ("F32", [64])
    _, findings, _ = fired(tmp_path, "kimi-linear", tensors=tensors)
    bad = only(findings, "CKPT004")
    assert bad and all("o_norm" in f["message"] for f in bad)


def test_ckpt005_and_006_shards(tmp_path):
    d = make_model(tmp_path, "llama-3.1-8b", shards=3)
    (d / "model-00002-of-00003.safetensors").rename(d / "stray.safetensors")
    code, doc = check_json(str(d), *STATIC)
    found = codes(doc)
    assert code == 1 and "CKPT005" in found and "CKPT006" in found
    [missing] = only(doc["results"][0]["findings"], "CKPT005")
    assert missing["evidence"]["shard"] == "model-00002-of-00003.safetensors"


def test_ckpt007_mixed_dtypes(tmp_path):
    def tensors(layout):
        name = "model.layers.5.self_attn.k_proj.weight"
        layout[name] = ("F32", layout[name][1])
    _, findings, _ = fired(tmp_path, "llama-3.1-8b", tensors=tensors)
    [f] = only(findings, "CKPT007")
    assert f["layer"] == 5 and f["severity"] == "warning"


def test_ckpt008_no_checkpoint_is_info(tmp_path):
    code, findings, _ = fired(tmp_path, "llama-3.1-8b", checkpoint=False)
    assert [f["code"] for f in findings] == ["CKPT008"] and code == 0


def test_finding_points_at_the_config_line(tmp_path):
    _, findings, d = fired(tmp_path, "llama-3.1-8b", edit=lambda c: c.update(vocab_size=128000))
    f = only(findings, "CKPT003")[0]
    line = (d / "config.json").read_text().splitlines()[f["line"] - 1]
    assert '"vocab_size"' in line
    assert json.loads("{" + line.strip().rstrip(",") + "}")["vocab_size"] == 128000
