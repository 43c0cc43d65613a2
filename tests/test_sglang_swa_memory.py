"""SGL011: sliding layers kept out of hybrid-SWA memory hold full-length slots; the warning gives the cost
from the profile's own sizing model, and says whether attention still masks the window (SGL004's case
when it does not)."""
from __future__ import annotations

import json
from pathlib import Path

from helpers import check_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
NO_SGLANG = {"KVDOCTOR_SGLANG_PYTHON": "/nonexistent/python"}


def findings(model: str, tmp_path: Path, **settings) -> tuple[int, list[dict]]:
    args = [str(FIXTURES / model), "--engine", "sglang", "--static"]
    if settings:
        path = tmp_path / "deploy.yaml"
        path.write_text("sglang:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items()))
        args += ["--deploy", str(path)]
    rc, doc = check_json(*args, env=NO_SGLANG)
    assert doc["results"][0].get("error") is None
    return rc, doc["results"][0]["findings"]


def sgl011(items: list[dict]) -> list[dict]:
    return [f for f in items if f["code"] == "SGL011"]


def test_gemma3_outside_the_allow_list_costs_its_sliding_layers_bytes(tmp_path):
    rc, items = findings("google__gemma-3-1b-it", tmp_path, kv_budget="40GiB")
    [found] = sgl011(items)
    ev = found["evidence"]
    assert found["severity"] == "warning" and rc == 0
    assert ev["why"] == "not-on-allow-list" and len(ev["sliding_layers"]) == 22 and ev["window"] == [512]
    # 1 kv head x 256 x (key + value) x 2 bytes per sliding layer, 26 attention layers in the one pool
    assert ev["sliding_bytes_per_token"] == 22 * 1024 and ev["pool_bytes_per_token"] == 26 * 1024
    assert ev["masks_window"] is True and ev["unmasked_layers"] == []
    assert ev["pool_tokens"] == 40 * (1 << 30) // (26 * 1024)  # the one pool at 40 GiB, page 1
    assert ev["pool_tokens_without_full_length_sliding"] == 40 * (1 << 30) // (4 * 1024)  # an upper bound
    assert "still masks the window" in found["message"] and "SGL004" not in {f["code"] for f in items}


def test_the_flag_on_an_allow_listed_model_costs_sglangs_own_split(tmp_path):
    _, items = findings("openai__gpt-oss-20b", tmp_path, kv_budget="40GiB", disable_hybrid_swa_memory="true")
    [found] = sgl011(items)
    ev = found["evidence"]
    assert ev["why"] == "disabled-by-flag" and ev["masks_window"] is True
    # the goldens: 873813 tokens in one pool with the flag (sglang_check.json), 970903 full-pool tokens without
    assert (ev["pool_tokens"], ev["pool_tokens_without_full_length_sliding"]) == (873813, 970903)
    _, quiet = findings("openai__gpt-oss-20b", tmp_path, kv_budget="40GiB")
    assert sgl011(quiet) == []


def test_an_unmasked_window_is_said_and_left_to_sgl004(tmp_path):
    rc, items = findings("mistralai__Mistral-7B-v0.1", tmp_path)
    [found] = sgl011(items)
    assert found["evidence"]["masks_window"] is False and len(found["evidence"]["unmasked_layers"]) == 32
    assert "SGL004" in {f["code"] for f in items} and rc == 1  # SGL004 is the error, SGL011 only the cost


def test_quiet_without_sliding_layers_or_when_no_request_outgrows_the_window(tmp_path):
    _, items = findings("meta-llama__Llama-3.1-8B", tmp_path)
    assert sgl011(items) == []
    _, items = findings("google__gemma-3-1b-it", tmp_path, context_length=512)
    assert sgl011(items) == []


def test_chunked_layers_under_the_flag_count_too(tmp_path):
    import json
    import shutil

    model = tmp_path / "llama4"
    model.mkdir()
    real = FIXTURES.parent / "configs" / "real" / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json"
    shutil.copy(real, model / "config.json")
    path = tmp_path / "deploy.yaml"
    path.write_text("sglang:\n  disable_hybrid_swa_memory: true\n  kv_budget: 40GiB\n")
    _, doc = check_json(str(model), "--engine", "sglang", "--static", "--deploy", str(path), env=NO_SGLANG)
    [found] = sgl011(doc["results"][0]["findings"])
    ev = found["evidence"]
    assert len(ev["sliding_layers"]) == 36 and ev["window"] == [8192] and "chunked-attention" in found["message"]
    # the goldens' Llama-4 Scout at 40 GiB: one pool with the flag, SGLang's own full / SWA split without it
    golden = json.loads((FIXTURES.parent.parent / "goldens" / "sglang_check.json").read_text())
    sized = {p["setting"]: p["result"]["sizing_40GiB"] for p in golden["points"]
             if p["model"] == "meta-llama__Llama-4-Scout-17B-16E-Instruct" and p["mutation"] == "none"
             and p["setting"] in ("default", "disable_hybrid_swa_memory")}
    assert ev["pool_tokens"] == sized["disable_hybrid_swa_memory"]["max_total_num_tokens"]
    assert ev["pool_tokens_without_full_length_sliding"] == sized["default"]["full_max_total_num_tokens"]


def test_an_all_sliding_model_outside_the_allow_list_sizes_without_crashing(tmp_path):
    """Every layer sliding (a Mistral-family config whose layer_types say so): with only windowed layers there
    is no full-attention pool to compare against, so the warning gives the cost without a token count
    (this divided by zero bytes per token once)."""
    cfg = json.loads((FIXTURES / "mistralai__Mistral-7B-v0.1" / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention"] * cfg["num_hidden_layers"]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "deploy.yaml").write_text("sglang:\n  kv_budget: 40GiB\n")
    rc, doc = check_json(str(tmp_path / "model"), "--engine", "sglang", "--static",
                         "--deploy", str(tmp_path / "deploy.yaml"), env=NO_SGLANG)
    result = doc["results"][0]
    assert result.get("error") is None, result["error"]
    [found] = sgl011(result["findings"])
    ev = found["evidence"]
    assert len(ev["sliding_layers"]) == 32 and ev["pool_tokens"] == 40 * (1 << 30) // (32 * 8 * 128 * 2 * 2)
    assert ev["pool_tokens_without_full_length_sliding"] is None and "tokens lost" not in found["message"]
    assert rc == 1  # SGL004: Mistral's attention does not mask the window
