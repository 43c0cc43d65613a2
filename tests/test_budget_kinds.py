"""`kvdoctor budget` on the kinds engines size differently: MLA at its latent width, kinds whose
engine sizing kvdoctor does not know refused with a message that says so, never priced as full."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdoctor.errors import InputError

from helpers import ROOT, run

CORPUS = ROOT / "fixtures" / "configs" / "real"


def _dir(tmp_path: Path, name: str, edit=None) -> Path:
    d = tmp_path / name
    d.mkdir()
    cfg = json.loads((CORPUS / f"{name}.json").read_text())
    if edit:
        edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_deepseek_v3_is_priced_at_its_latent_not_as_full_attention(tmp_path):
    d = _dir(tmp_path, "deepseek-ai__DeepSeek-V3")
    proc = run("budget", str(d), "--engine", "vllm", "--kv-budget", "40GiB", "--context", "131072", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    engine = json.loads(proc.stdout)["engines"][0]
    (kind,) = engine["layer_kinds"]
    # vLLM's MLAAttentionSpec: (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes, one "head", per token per layer
    assert (kind["spec"], kind["layers"], kind["bytes_per_token_per_layer"]) == ("MLAAttentionSpec", 61, 1152)
    assert engine["capacity"]["max_model_len_fit"] == 131072
    assert not [f for f in engine.get("findings", []) if f.get("code") == "MEM004"]


def test_a_kind_without_known_engine_sizing_is_refused_not_priced_as_full(tmp_path):
    d = _dir(tmp_path, "meta-llama__Llama-4-Scout-17B-16E-Instruct")
    proc = run("budget", str(d), "--engine", "mlx-lm", "--kv-budget", "40GiB", "--context", "131072")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "chunked_attention" in proc.stderr and "does not know" in proc.stderr


def test_all_engines_price_what_each_can_and_name_the_others(tmp_path):
    """Llama-4's chunked layers: vLLM builds ChunkedLocalAttentionSpec for them (its profile's reading,
    the one `check --engine vllm` uses), SGLang puts them in its SWA pool; mlx-lm's budget does not
    know the kind and says so."""
    d = _dir(tmp_path, "meta-llama__Llama-4-Scout-17B-16E-Instruct")
    proc = run("budget", str(d), "--kv-budget", "40GiB", "--context", "131072", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {row["engine"] for row in doc["engines"]} == {"vllm", "sglang"}
    assert [(r["engine"], "chunked_attention" in r["why"]) for r in doc["not_priced"]] == [("mlx-lm", True)]
    vllm_row = next(row for row in doc["engines"] if row["engine"] == "vllm")
    kinds = {k["spec"]: (k["layers"], k["window"]) for k in vllm_row["layer_kinds"]}
    assert kinds == {"ChunkedLocalAttentionSpec": (36, 8192), "FullAttentionSpec": (12, None)}
    rich = run("budget", str(d), "--kv-budget", "40GiB", "--context", "131072")
    assert rich.returncode == 0 and "mlx-lm: not priced" in rich.stdout


@pytest.mark.parametrize("name", ["nvidia__Nemotron-H-56B-Base-8K", "LiquidAI__LFM2.5-VL-1.6B"])
def test_vllm_budget_sizes_mamba2_and_short_conv_state_as_check_does(tmp_path, name):
    """Mamba-2 (Nemotron-H) and short-convolution (LFM2) state layers: `budget --engine vllm` gives the
    KV cache groups that `check --engine vllm` plans (page sizes checked against vLLM's own code in
    tests/test_vllm_profile.py)."""
    d = _dir(tmp_path, name)
    budget = run("budget", str(d), "--engine", "vllm", "--kv-budget", "40GiB", "--context", "8192", "--format", "json")
    assert budget.returncode == 0, budget.stderr
    row = json.loads(budget.stdout)["engines"][0]
    check = run("check", str(d), "--engine", "vllm", "--static", "--format", "json", "--select", "VLM")
    planned = json.loads(check.stdout)["results"][0]["info"]["vllm"]["groups"]
    assert sorted((g["spec"], g["block_size"], g["page_bytes"]) for g in row["groups"]) == sorted(
        (g["spec"], g["block_size"], g["page_bytes"]) for g in planned)
    assert row["state"] and row["capacity"]["tokens"] > 0


def test_blocks_without_attention_cache_nothing(tmp_path):
    d = _dir(tmp_path, "nvidia__Llama-3_3-Nemotron-Super-49B-v1")
    proc = run("budget", str(d), "--engine", "vllm", "--kv-budget", "40GiB", "--context", "8192", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"]["layer_kinds"] == {"full": 49}  # 31 no-op attention blocks left out


SGLANG_SIZED = [p for p in json.loads((ROOT / "goldens" / "sglang_check.json").read_text())["points"]
                if p.get("mutation") == "none" and p.get("setting") == "default" and "sizing_40GiB" in p["result"]]
# Configs the budget refuses to price (one line, exit 2) where SGLang sizes them. A config stating no context
# (Gemma-3) takes its class's default, as SGLang does.
BUDGET_REFUSES = {
    **dict.fromkeys(("sgl9__mistralai__Mamba-Codestral-7B-v0.1", "sgl9__tiiuae__falcon-mamba-7b"),
                    "config.json states no context: the budget asks for --context, SGLang takes its default 2048"),
}


@pytest.mark.parametrize("point", [pytest.param(p, id=p["model"], marks=[pytest.mark.xfail(
    raises=InputError, reason=BUDGET_REFUSES[p["model"]], strict=True)] if p["model"] in BUDGET_REFUSES else [])
    for p in SGLANG_SIZED])
def test_sglang_budget_matches_sglangs_own_sizing_at_40GiB(tmp_path, point):
    """`kvdoctor budget --engine sglang` against SGLang 0.5.23's own sizing of the same config
    (goldens/sglang_check.json): pool tokens, max running requests, Mamba state slots. The Mamba-2
    (Nemotron-H), DSA (GLM-5, DeepSeek-V3.2 style) and DeepSeek-V4 models and Llama-4's chunked layers (SWA
    layers to SGLang) included."""
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.load.loader import load_model
    from kvdoctor.pipeline.budget import budget_document, budget_inputs

    d = tmp_path / point["model"]
    d.mkdir()
    (d / "config.json").write_text(json.dumps(point["config"]))
    want = point["result"]["sizing_40GiB"]
    deploy = Deploy()
    row = budget_document(load_model(str(d)), deploy, budget_inputs(deploy, kv_budget="40GiB"), "sglang")["engines"][0]
    assert row["capacity"]["max_running_requests"] == want["max_running_requests"]
    pools = {p["pool"]: p["tokens"] for p in row["pools"]}
    if want["swa_max_total_num_tokens"] is not None:
        assert pools == {"full": want["full_max_total_num_tokens"], "swa": want["swa_max_total_num_tokens"]}
    else:
        assert pools == {"full": want["max_total_num_tokens"]}
    assert (row.get("state") or {}).get("slots") == want.get("max_mamba_cache_size")


def test_an_engine_that_cannot_size_a_config_is_listed_not_fatal(tmp_path):
    """Gemma-3 without sliding_window: mlx-lm would take its own ModelArgs default, which kvdoctor does not
    read. Alone that engine is one line and exit 2; beside the others it is listed as not priced."""
    from helpers import make_model

    model = make_model(tmp_path, "gemma-3-1b-it", checkpoint=False, edit=lambda cfg: cfg.pop("sliding_window"))
    alone = run("budget", str(model), "--engine", "mlx-lm", "--kv-budget", "10GiB")
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1 and "gives no sliding_window" in alone.stderr
    every = run("budget", str(model), "--kv-budget", "10GiB", "--format", "json")
    assert every.returncode == 0, every.stderr
    doc = json.loads(every.stdout)
    assert [row["engine"] for row in doc["not_priced"]] == ["mlx-lm"] and doc["engines"]
