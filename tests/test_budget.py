"""`kvdoctor budget` and the MEM rules: the CLI as a user runs it, each rule on a fixture that fires
it and a healthy one that keeps it quiet, and regression cases back-solved from engine logs."""
from __future__ import annotations

import json
from pathlib import Path
from functools import lru_cache

import pytest

from helpers import REAL, REAL_NAMES, ROOT, SHORT, check_json, codes, make_model, run
from kvdoctor.engines.sglang import budget as sglang
from kvdoctor.engines.vllm import budget as vllm
from kvdoctor.engines.budget.common import GiB
from kvdoctor.engines.budget.facts import facts_from_spec
from kvdoctor.engines.budget.run import plan_engine
from kvdoctor.engines.budget.settings import parse_size
from kvdoctor.checks.budget import findings_for
from kvdoctor.engines.deploy import deploy_from
from kvdoctor.engines.pins import PINS
from kvdoctor.errors import InputError
from kvdoctor.load.loader import load_model


@lru_cache(maxsize=None)
def model(name: str):
    spec = load_model(str(REAL / SHORT.get(name, name)), with_checkpoint=False)
    return facts_from_spec(spec), spec.config


def budgets_for(name: str, engine: str, **settings) -> list:
    """One engine's default-mode budgets for a deploy file's `budget:` section plus engine sections
    (given as vllm=..., sglang=..., mlx_lm=...)."""
    sections = {k: settings.pop(k) for k in ("vllm", "sglang", "mlx_lm") if k in settings}
    deploy = deploy_from({"budget": {"kv_budget": "40GiB", **settings}, **sections})
    facts, config = model(name)
    budgets, _ = plan_engine(engine, facts, config, deploy.budget, deploy.settings(engine), all_modes=False)
    return budgets


def mem_codes(name: str, engine: str, **settings) -> list[str]:
    """MEM codes of one engine's default mode for settings given as deploy sections."""
    facts, _ = model(name)
    return [f.code for b in budgets_for(name, engine, **settings) for f in findings_for(facts, b, {})]


def budget_json(*args: str) -> dict:
    proc = run("budget", "--format", "json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --- the command ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", REAL_NAMES)
def test_budget_prints_every_engine_and_mode_for_every_config(name):
    proc = run("budget", str(REAL / name), "--kv-budget", "40GiB", "--mode", "all", "--verbose",
               env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    for title in (f"vllm {PINS['vllm']}: KV budget 40.00 GiB", "sglang 0.5.23: KV budget 40.00 GiB",
                  "mlx-lm 0.32.2: KV budget 40.00 GiB", "capacity unit:"):
        assert title in proc.stdout
    assert "hma on" in proc.stdout and "hma off" in proc.stdout


def test_json_shape_has_mode_kinds_layout_state_capacity_unit_and_provenance():
    doc = budget_json(str(REAL / SHORT["gpt-oss-20b"]), "--kv-budget", "40GiB", "--context", "131072")
    assert doc["schema"] == "kvdoctor.budget/1"
    assert doc["model"]["layer_kinds"] == {"sliding": 12, "full": 12}
    rows = {row["engine"]: row for row in doc["engines"]}
    assert set(rows) == {"vllm", "sglang", "mlx-lm"}
    for row in rows.values():
        assert {"mode", "layer_kinds", "state", "capacity", "provenance", "budget", "findings"} <= set(row)
        assert row["budget"]["source"] == "user"
    assert rows["vllm"]["capacity"]["unit"] == "request_tokens_at_L"
    # vLLM 0.34.0 (the default release) in blocks of 64, as its own code sizes them (goldens/vllm-0.34.0.json)
    assert rows["vllm"]["capacity"]["tokens"] == 1551387
    assert rows["vllm"]["mode"]["in_flight_tokens"] == 16384
    assert [g["blocks_per_request"] for g in rows["vllm"]["groups"]] == [259, 2048]
    assert rows["sglang"]["capacity"]["unit"] == "pool_tokens"
    assert [(p["pool"], p["tokens"]) for p in rows["sglang"]["pools"]] == [("full", 970903), ("swa", 776722)]
    assert rows["mlx-lm"]["capacity"]["unit"] == "requests"
    assert rows["mlx-lm"]["capacity"]["per_request_bytes"] == 3224371200


def test_engine_choice_and_mode_all_give_one_row_per_mode():
    doc = budget_json(str(REAL / SHORT["qwen3-next"]), "--engine", "sglang", "--mode", "all", "--kv-budget", "40GiB")
    assert {row["engine"] for row in doc["engines"]} == {"sglang"}
    dtypes = [row["mode"]["mamba_ssm_dtype"] for row in doc["engines"]]
    assert "float32" in dtypes and "bfloat16" in dtypes


def test_deploy_budget_section_supplies_the_knobs(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("budget:\n  kv_budget: 20GiB\n  context: 32768\n  engines: [vllm]\n"
                      "  vllm:\n    hma: false\n    kv_cache_dtype: fp8\n")
    doc = budget_json(str(REAL / SHORT["gpt-oss-20b"]), "--engine", "vllm", "--deploy", str(deploy))
    (row,) = doc["engines"]
    assert row["mode"]["hma"] is False and row["mode"]["kv_cache_dtype"] == "fp8"
    assert row["mode"]["max_model_len"] == 32768 and row["budget"]["kv_budget_bytes"] == 20 * GiB
    assert "MEM003" in [f["code"] for f in row["findings"]]


def test_gpu_size_gives_an_estimate_from_checkpoint_headers(tmp_path):
    d = make_model(tmp_path, "gpt-oss-20b")
    doc = budget_json(str(d), "--gpu-memory", "141GiB", "--engine", "vllm")
    (row,) = doc["engines"]
    weights = load_model(str(d)).checkpoint.total_bytes
    assert row["budget"]["source"] == "estimated"
    # 0.34.0's default utilization (1.0), less the extensible KV cache's margin floor (1 GiB); 0.33.0's 0.92, no margin
    assert row["budget"]["kv_budget_bytes"] == int(141 * GiB * 1.0) - weights - GiB
    (old,) = budget_json(str(d), "--gpu-memory", "141GiB", "--engine", "vllm==0.33.0")["engines"]
    assert old["budget"]["kv_budget_bytes"] == int(141 * GiB * 0.92) - weights
    proc = run("budget", str(d), "--gpu-memory", "141GiB", env={"COLUMNS": "200"})
    assert "ESTIMATED" in proc.stdout


def test_budget_and_fit_decide_the_extensible_kv_cache_alike(tmp_path):
    """vLLM 0.34.0 (the pin): the `vllm:` section's enable_extensible_kv_cache: false or a given
    gpu_memory_utilization moves `budget --gpu-memory` as it moves `fit` (one decision, vllm.budget.utilization).
    budget used to take 1.0 and the margin floor from the release alone, whatever the section said."""
    d = make_model(tmp_path, "gpt-oss-20b")
    weights = load_model(str(d)).checkpoint.total_bytes
    deploy = tmp_path / "deploy.yaml"

    def estimate(section: str, engine: str = "vllm") -> int:
        deploy.write_text(f"vllm:\n  {section}\n")
        (row,) = budget_json(str(d), "--gpu-memory", "141GiB", "--engine", engine, "--deploy", str(deploy))["engines"]
        return row["budget"]["kv_budget_bytes"]

    assert estimate("enable_extensible_kv_cache: false") == int(141 * GiB * 0.92) - weights  # was 1.0, less 1 GiB
    assert estimate("gpu_memory_utilization: 0.8") == int(141 * GiB * 0.8) - weights - GiB  # was 1.0
    assert estimate("enable_extensible_kv_cache: true") == int(141 * GiB) - weights - GiB
    pin = PINS["vllm"]
    assert vllm.utilization(pin, {}) == (1.0, True)
    assert vllm.utilization(pin, {"enable_extensible_kv_cache": False}) == (0.92, False)
    assert vllm.utilization(pin, {"kv_budget": "40GiB"}) == (0.92, False)
    assert vllm.utilization(pin, {"gpu_memory_utilization": 0.8}) == (0.8, True)
    deploy.write_text("vllm:\n  enable_extensible_kv_cache: false\n")
    proc = run("budget", str(d), "--gpu-memory", "141GiB", "--engine", "vllm==0.33.0", "--deploy", str(deploy))
    assert proc.returncode == 2 and "no extensible KV cache" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, expected", [
    ((), "give the memory left for KV caches"),
    (("--kv-budget", "lots"), "expected a size such as 40GiB"),
    (("--kv-budget", "0GiB"), "out of range"),
    (("--kv-budget", "40GiB", "--engine", "tgi"), "--engine: unknown engine 'tgi'"),
    (("--kv-budget", "40GiB", "--mode", "some"), "--mode 'some'"),
    (("--gpu-memory", "80GiB"), "needs the checkpoint's safetensors headers"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    proc = run("budget", str(REAL / SHORT["llama-3.1-8b"]), *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_bad_budget_section_in_deploy_file_names_the_line(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("budget:\n  kv_budget: 40GiB\n  vllm:\n    hma: maybe\n")
    proc = run("budget", str(REAL / SHORT["llama-3.1-8b"]), "--deploy", str(deploy))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{deploy}:4" in proc.stderr and "budget.vllm.hma" in proc.stderr


def test_parse_size_units():
    assert parse_size("40GiB") == 40 * GiB
    assert parse_size("80 GB") == 80 * 10 ** 9
    assert parse_size(1024) == 1024
    with pytest.raises(InputError):
        parse_size("12 parsecs")


# --- rules: each fires on its fixture, a healthy one stays quiet ------------------------------------

def test_mem001_max_num_seqs_over_mamba_blocks():
    assert "MEM001" in mem_codes("qwen3-next", "vllm", kv_budget="4GiB", context=131072)
    assert "MEM001" not in mem_codes("qwen3-next", "vllm", context=131072, vllm={"max_num_seqs": 256})
    assert "MEM001" not in mem_codes("qwen3-next", "vllm", kv_budget="4GiB", vllm={"cudagraph_full": False})


def test_mem002_hma_off_on_a_linear_hybrid():
    assert "MEM002" in mem_codes("qwen3-next", "vllm", context=131072, vllm={"hma": False})
    assert "MEM002" in mem_codes("kimi-linear", "vllm", context=131072, vllm={"hma": False})
    assert "MEM002" not in mem_codes("qwen3-next", "vllm", context=131072)


def test_mem003_hma_off_over_reservation_in_bytes_and_ratio():
    facts, config = model("gpt-oss-20b")
    (budget,) = budgets_for("gpt-oss-20b", "vllm", context=131072, vllm={"hma": False})
    (finding,) = [f for f in findings_for(facts, budget, {}) if f.code == "MEM003"]
    assert finding.evidence["ratio"] == pytest.approx(1.7758, abs=1e-3)  # 11.84x on vs 6.67x off
    assert "Hybrid KV cache manager is disabled" in finding.evidence["engine_log"][0]
    assert "MEM003" not in mem_codes("gpt-oss-20b", "vllm", context=131072)
    assert "MEM003" not in mem_codes("llama-3.1-8b", "vllm", context=131072, vllm={"hma": False})


def test_mem004_max_model_len_does_not_fit_with_the_engines_estimate():
    facts, config = model("gpt-oss-20b")
    (budget,) = budgets_for("gpt-oss-20b", "vllm", kv_budget="1GiB", context=131072)
    (finding,) = [f for f in findings_for(facts, budget, {}) if f.code == "MEM004"]
    assert finding.evidence["max_model_len_fit"] == 27008  # 0.34.0's blocks of 64 (goldens/vllm-0.34.0.json)
    assert "the estimated maximum model length is 27008" in finding.engine_error["message"]
    assert "MEM004" not in mem_codes("gpt-oss-20b", "vllm", context=131072)


def test_mem005_block_inflation_and_mem006_group_padding():
    assert "MEM005" in mem_codes("qwen3-next", "vllm", context=131072)
    assert "MEM005" not in mem_codes("llama-3.1-8b", "vllm", context=131072)
    assert "MEM006" in mem_codes("gemma-3-1b-it", "vllm", context=32768)
    assert "MEM006" not in mem_codes("gpt-oss-20b", "vllm", context=131072)


def test_mem007_swa_pool_below_window_plus_page():
    assert "MEM007" in mem_codes("gpt-oss-20b", "sglang", kv_budget="32MiB", context=131072,
                                 sglang={"swa_full_tokens_ratio": 0.1})
    assert "MEM007" not in mem_codes("gpt-oss-20b", "sglang", context=131072)


def test_mem008_running_requests_capped_and_mem010_fp32_state():
    assert {"MEM008", "MEM010"} <= set(mem_codes("qwen3-next", "sglang", context=131072))
    assert "MEM010" not in mem_codes("qwen3-next", "sglang", context=131072, sglang={"mamba_ssm_dtype": "bfloat16"})
    assert "MEM010" not in mem_codes("kimi-linear", "sglang", context=131072)  # vLLM keeps KDA state in fp32 too
    assert not {"MEM008", "MEM010"} & set(mem_codes("gpt-oss-20b", "sglang", context=131072))


def test_mem010_says_where_vllm_keeps_float32_too(tmp_path):
    """Qwen3.5's config class hands vLLM the config's mamba_ssm_dtype (float32); Qwen3-Next's does not."""
    def mem010(directory: Path) -> str:
        spec = load_model(str(directory), with_checkpoint=False)
        facts = facts_from_spec(spec)
        deploy = deploy_from({"budget": {"kv_budget": "40GiB", "context": 131072}})
        budgets, _ = plan_engine("sglang", facts, spec.config, deploy.budget, deploy.settings("sglang"), all_modes=False)
        (finding,) = [f for b in budgets for f in findings_for(facts, b, {}) if f.code == "MEM010"]
        return finding.message

    (tmp_path / "config.json").write_bytes((ROOT / "fixtures/configs/real/Qwen__Qwen3.5-27B.json").read_bytes())
    assert "where vLLM keeps float32 too (the config's mamba_ssm_dtype)" in mem010(tmp_path)
    assert "where vLLM keeps the model dtype" in mem010(REAL / SHORT.get("qwen3-next", "qwen3-next"))


def test_mem009_no_swa_pool_for_the_architecture():
    facts, config = model("gemma-3-1b-it")
    (budget,) = budgets_for("gemma-3-1b-it", "sglang")
    (finding,) = [f for f in findings_for(facts, budget, {}) if f.code == "MEM009"]
    assert finding.evidence["engine_log"] == ["Disable hybrid SWA memory for Gemma3ForCausalLM as it is not yet "
                                              "supported."]
    assert "MEM009" in mem_codes("mistral-7b", "sglang")
    assert "MEM009" not in mem_codes("gpt-oss-20b", "sglang")
    assert "MEM009" not in mem_codes("llama-3.1-8b", "sglang")


def test_mem011_kv_bits_with_rotating_caches_and_mem012_ignored_max_kv_size():
    assert "MEM011" in mem_codes("gpt-oss-20b", "mlx-lm", context=8192, mlx_lm={"kv_bits": 8})
    assert "MEM011" not in mem_codes("gpt-oss-20b", "mlx-lm", context=4096, mlx_lm={"kv_bits": 8})
    assert "MEM011" not in mem_codes("llama-3.1-8b", "mlx-lm", context=8192, mlx_lm={"kv_bits": 8})
    assert "MEM012" in mem_codes("llama-3.1-8b", "mlx-lm", context=8192, mlx_lm={"max_kv_size": 4096})
    assert "MEM012" not in mem_codes("qwen2.5-7b", "mlx-lm", context=8192, mlx_lm={"max_kv_size": 4096})


def test_mem013_budget_too_small_and_mem014_tp():
    assert "MEM013" in mem_codes("qwen3-next", "sglang", kv_budget="256MiB")
    assert "MEM013" not in mem_codes("qwen3-next", "sglang")
    assert "MEM014" in mem_codes("gemma-3-1b-it", "vllm", vllm={"tp": 8})
    assert "MEM014" not in mem_codes("gemma-3-1b-it", "vllm", vllm={"tp": 4})


def test_check_runs_budget_rules_when_the_deploy_sets_a_budget(tmp_path):
    d = make_model(tmp_path, "qwen3-next", checkpoint=False)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("budget:\n  kv_budget: 4GiB\n  context: 131072\n  engines: [vllm]\n"
                      "  vllm:\n    max_num_seqs: 1024\n")
    rc, doc = check_json(str(d), "--deploy", str(deploy), "--select", "MEM", "--exit-zero")
    found = [f for f in doc["results"][0]["findings"] if f["code"] == "MEM001"]
    assert found and found[0]["line"] == 6 and found[0]["file"] == str(deploy)
    assert found[0]["engine_error"]["message"].startswith("max_num_seqs (1024) exceeds available Mamba cache blocks")
    rc, doc = check_json(str(d), "--select", "MEM")
    assert codes(doc) == []  # no budget section: the budget rules stay out of the way


# --- regression cases back-solved from published engine logs -----------------------------------------

def test_vllm_28228_kimi_linear_block_960_at_tp2_with_the_older_64_alignment():
    facts, _ = model("kimi-linear")
    mode = vllm.Mode(max_model_len=131072, kv_budget_bytes=40 * GiB, tp=2)
    _, _, per_token = vllm.attention_per_token(facts, mode)
    state, _ = vllm.state_bytes(facts, mode)
    block, padded = vllm.align_hybrid(16, per_token, state, mla=True, mla_unit=64)
    assert block == 960 and f"{100 * (padded - state) / state:.2f}" == "1.89"  # what the log printed
    assert vllm.plan(facts, mode).mode.block_size == 1024  # 0.33.0 aligns MLA hybrids to 128


def test_vllm_49064_max_num_seqs_1024_over_969_mamba_blocks():
    facts, _ = model("qwen3-next")
    probe = vllm.plan(facts, vllm.Mode(max_model_len=132000, kv_budget_bytes=40 * GiB))
    stride = probe.pool.bytes_per_block
    budget = vllm.plan(facts, vllm.Mode(max_model_len=132000, kv_budget_bytes=969 * stride + stride // 2))
    (finding,) = [f for f in findings_for(facts, budget, {}) if f.code == "MEM001"]
    assert finding.engine_error["message"].startswith(
        "max_num_seqs (1024) exceeds available Mamba cache blocks (969). Each decode sequence requires one Mamba "
        "cache block")


def test_vllm_40691_logged_tokens_are_concurrency_times_length_not_blocks_times_block_size():
    facts, _ = model("qwen3-next")
    b = vllm.plan(facts, vllm.Mode(max_model_len=131072, kv_budget_bytes=40 * GiB))
    assert b.capacity.tokens == int(b.capacity.max_concurrency * 131072) == 1699454  # 0.34.0 (vllm-0.34.0.json)
    assert b.pool.num_blocks * b.mode.block_size != b.capacity.tokens


def test_sglang_pr_37610_swa_pool_of_one_page_below_window_plus_page():
    with pytest.raises(Exception) as info:
        sglang.swa_floor(256, 128, 256)
    assert info.value.message == ("SWA pool (256 tokens) cannot hold even one request: the prefill admission floor "
                                  "is sliding_window_size (128) + page_size (256). Increase --swa-full-tokens-ratio "
                                  "or the total KV budget.")
    sglang.swa_floor(512, 128, 256)  # window + page below the pool: admitted


def test_reference_side_by_side_numbers():
    """kv-budget.md §5 (40 GiB, 128K, TP1): the engines' own numbers, reproduced. SGLang's running requests
    are its CUDA path's (goldens/sglang.json): the `extra_buffer` Mamba strategy holds 5 state slots per
    request, so 262 slots serve 52, not the 87 of the CPU path's 3 slots the memo measured."""
    facts, _ = model("qwen3-next")
    s = sglang.plan(facts, sglang.Mode(context_length=131072, kv_budget_bytes=40 * GiB))
    assert (s.state.slots, s.capacity.max_total_num_tokens, s.capacity.max_running_requests) == \
        (262, 920754, 52)
    assert (s.state.slots_per_request, s.state.mamba_radix_cache_strategy) == (5, "extra_buffer")
    assert s.state.bytes_per_slot / 1e6 == pytest.approx(77.3, abs=0.05)
    off = vllm.plan(model("gpt-oss-20b")[0], vllm.Mode(max_model_len=131072, kv_budget_bytes=40 * GiB, hma=False,
                                                       release="0.33.0"))  # the memo's release
    assert (off.capacity.tokens, round(off.capacity.max_concurrency, 2)) == (873808, 6.67)


@pytest.mark.parametrize("name, deploy", [("llama-3.1-8b", None),
                                          ("llama-3.1-8b", {"sglang": {"tp_size": 2, "mem_fraction_static": 0.9}}),
                                          ("Qwen__Qwen3-VL-8B-Instruct", None)])
def test_sglang_budget_and_fit_read_one_reserve(tmp_path, name, deploy):
    """`budget --engine sglang --gpu-memory` and `fit --engine sglang` price SGLang's pools with one formula
    (sglang.reserve.pool): the same memory free before loading and the same share held back, at SGLang's own
    default mem_fraction_static or the deploy file's; only their weights differ (budget's total / TP). Both read
    config.json as written: a VLM's default is shrunk for its vision tower, and its prefill graphs are off."""
    d = make_model(tmp_path, name if name in SHORT else json.loads((ROOT / "fixtures/configs/real" / f"{name}.json")
                                                                   .read_text()))
    extra: list[str] = []
    if deploy:
        path = tmp_path / "deploy.yaml"
        path.write_text(json.dumps(deploy))
        extra = ["--deploy", str(path)]
    (row,) = budget_json(str(d), "--engine", "sglang", "--gpu-memory", "80GiB", *extra)["engines"]
    b = row["budget"]
    proc = run("fit", str(d), "--engine", "sglang", "--gpu", "H100-80GB", "--gpu-memory", "80GiB", "--gpus",
               "2" if deploy else "1", "--format", "json", *extra)
    fit = next(r for r in json.loads(proc.stdout)["rows"] if r["layout"]["tp"] == (2 if deploy else 1)
               and r["layout"]["pp"] == 1)
    assert b["kv_budget_bytes"] + b["weights_bytes"] == fit["kv_bytes"] + fit["weights"]["bytes_per_rank"]
    terms = {t["name"]: t for t in fit["terms"]}
    assert f"reserved {terms['reserved']['bytes']} B" in b["how"]
    if deploy:
        assert "mem_fraction_static 0.9)" in b["how"]
    else:  # no longer the old 10 GiB floor of a fixed reserve: SGLang's own default for an 80 GiB GPU at TP 1
        assert terms["reserved"]["bytes"] > 10 * GiB and "SGLang's default" in b["how"]
    vlm = "Qwen3-VL" in name
    assert ("for the vision tower" in b["how"], "no prefill CUDA graphs (multimodal model)" in b["how"]) == (vlm, vlm)
