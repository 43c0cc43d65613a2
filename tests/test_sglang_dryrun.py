"""`--engine sglang --dry-run`: SGLang 0.5.23's own CUDA start-up in a child process, against the static plan.

Needs a Python with SGLang 0.5.23 (goldens/.venv/sglang, or $KVDOCTOR_SGLANG_PYTHON); without one only the
'unavailable' path and the comparison on recorded shapes are tested. Each run takes 10-60 s on two cores,
so each model's run is shared by the tests of its module-scoped fixture.
"""
from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from kvdoctor.engines import child
from kvdoctor.checks import dryrun_sglang
from kvdoctor.catalog.matcher import code_for
from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines import profile
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.engines.sglang import dryrun
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
MODELS, REAL = ROOT / "fixtures" / "models", ROOT / "fixtures" / "configs" / "real"
PYTHON = child.find_python(None, dryrun.ENV_PYTHON, "sglang")
needs_sglang = pytest.mark.skipif(PYTHON is None, reason="no Python with SGLang 0.5.23 (goldens/.venv/sglang "
                                                         "absent; set KVDOCTOR_SGLANG_PYTHON)")


def spec_of(path: Path):
    return load_model(str(path), with_checkpoint=False, library_check=False)


def dry(spec, **settings):
    """The static plan and SGLang's own start-up for one model and one `sglang:` section."""
    section = SglangSettings(**settings)
    plan = profile("sglang").plan(spec, section)
    result = dryrun.launch(spec, dryrun.server_args(section), section.kv_budget or dryrun.DEFAULT_BUDGET, PYTHON,
                           timeout=600, planned_sliding=dryrun.planned_sliding(plan))
    result["budget_from_deploy"] = section.kv_budget is not None
    return plan, result


def codes(spec, plan, result) -> list[str]:
    return [f.code for f in dryrun_sglang.findings(spec, plan, dryrun.record(plan, result), builtin_catalog())]


def test_server_args_carry_only_what_is_set():
    assert dryrun.server_args(SglangSettings()) == {
        "kv_cache_dtype": "auto", "disable_hybrid_swa_memory": False, "swa_full_tokens_ratio": 0.8,
        "disable_radix_cache": False, "disable_overlap_schedule": False}  # page size: the backend's
    args = dryrun.server_args(SglangSettings(tp_size=8, context_length=4096, kv_budget="40GiB"))
    assert args["tp_size"] == 8 and args["context_length"] == 4096 and "kv_budget" not in args


def test_without_sglang_one_finding_and_the_static_plan_stands(tmp_path, monkeypatch):
    monkeypatch.delenv(dryrun.ENV_PYTHON, raising=False)
    monkeypatch.setattr(child, "REPO", tmp_path)  # no goldens/.venv/sglang there
    spec = spec_of(MODELS / "openai__gpt-oss-20b")
    seen = dryrun.SglangDryRunner().run(spec, SglangSettings(),
                                        profile("sglang").plan(spec, SglangSettings()),
                                        {"engine_python": str(tmp_path / "missing-python")})
    assert (seen.ran, seen.outcome) == (False, "unavailable") and "no Python with SGLang 0.5.23" in seen.reason
    from kvdoctor.checks import dryrun_sglang as rule
    from kvdoctor.checks.context import Context
    from kvdoctor.engines.deploy import Deploy

    ctx = Context(spec=spec, engine="sglang", deploy=Deploy(), plan=profile("sglang").plan(spec, SglangSettings()),
                  observations={"dry_run": seen})
    (finding,) = rule.run(ctx)
    assert finding.code == "ENG050" and "static SGLang checks still ran" in finding.message
    assert rule.RULE.codes_for("sglang") == ("ENG050", "ENG051", "ENG065", "ENG110", "SGL050", "SGL051")


def test_the_cost_is_estimated_from_the_plan_before_running():
    spec = spec_of(MODELS / "google__gemma-3-1b-it")
    cost = dryrun.estimate(spec, profile("sglang").plan(spec, SglangSettings()))
    assert cost["pool_tokens"] == 512 + 64 + 2 + 64  # a request 64 tokens past the 512-key window, an earlier one
    assert cost["bytes"] > dryrun.IMPORT_BYTES and cost["seconds"] == dryrun.IMPORT_SECONDS
    gpt_oss = spec_of(MODELS / "openai__gpt-oss-20b")
    assert dryrun.estimate(gpt_oss, profile("sglang").plan(gpt_oss, SglangSettings()))["pool_tokens"] == 258
    plain = spec_of(MODELS / "Qwen__Qwen2.5-7B-Instruct")  # no sliding layer: the 256 rows the pools have anyway
    assert dryrun.estimate(plain, profile("sglang").plan(plain, SglangSettings()))["pool_tokens"] == 256


# ---- SGLang's own code ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt_oss():
    spec = spec_of(MODELS / "openai__gpt-oss-20b")
    return (spec, *dry(spec))


@needs_sglang
def test_gpt_oss_starts_as_planned_and_its_sliding_layer_reads_its_window(gpt_oss):
    spec, plan, result = gpt_oss
    assert result["versions"]["sglang"] == "0.5.23" and result["outcome"] == {"start": True}
    model = result["model"]
    assert model["is_hybrid_swa"] and model["runner_sliding_window_size"] == 127
    assert model["swa_attention_layer_ids"] == list(range(0, 24, 2))
    assert result["pools"]["token_to_kv_pool"]["class"] == "SWAKVPool"
    assert result["pools"]["placements"]["3"] == ["full", 1]
    sliding, released, full = result["window_reads"]
    assert (sliding["layer"], sliding["keys_read_max"], sliding["off_window_count"]) == (0, 128, 0)
    assert sliding["length"] > 128 and not sliding["swa_slots_differ"]  # the request crossed the window
    assert (full["layer"], full["keys_read_max"], full["off_window_count"]) == (1, full["length"] + 1, 0)
    # once SWA slots differ from full-pool slots, torch_native indexes the SWA buffer with full-pool slots;
    # the deploy runs fa3 (which translates), so that is recorded, not reported
    assert released["after_swa_release"] and released["error"]["class"] == "IndexError"
    assert "torch_native_backend.py" in released["error"]["raised_at_sglang"]
    assert result["server_args"]["attention_backend"] == "fa3" and dryrun_sglang.torch_native_reads(spec, result) == []
    assert dryrun.disagreements(plan, result) == []
    assert codes(spec, plan, result) == []


@needs_sglang
def test_a_plan_for_another_window_is_stale(gpt_oss):
    """The same run held against a plan whose sliding layers read 256 keys: SGL050, naming the window."""
    spec, plan, result = gpt_oss
    layers = tuple(msgspec.structs.replace(l, engine_window=256) if l.engine_window == 128 else l for l in plan.layers)
    stale = msgspec.structs.replace(plan, layers=layers)
    found = dryrun_sglang.findings(spec, stale, dryrun.record(stale, result), builtin_catalog())
    assert [f.code for f in found] == ["SGL050"]
    assert "layer 0 attention (TorchNativeAttnBackend): reads a window of 128 keys" in found[0].message
    swapped = msgspec.structs.replace(plan, facts=msgspec.structs.replace(
        plan.facts, pools=msgspec.structs.replace(plan.facts.pools, hybrid_swa=False)))
    assert "hybrid-SWA memory: plan False, SGLang True" in dryrun.disagreements(swapped, result)


@needs_sglang
def test_qwen3_next_hybrid_state_pools_and_sizing_at_the_deploy_budget():
    spec = spec_of(MODELS / "Qwen__Qwen3-Next-80B-A3B-Instruct")
    plan, result = dry(spec, kv_budget="40GiB")
    assert result["outcome"] == {"start": True}
    assert result["pools"]["token_to_kv_pool"]["class"] == "HybridLinearKVPool"
    assert result["pools"]["mamba_pool"]["class"] == "MambaPool"
    assert result["sizing"]["max_running_requests"] == 52  # the CUDA path's 5 state slots per request
    assert result["state"]["layers"] == [i for i in range(48) if (i + 1) % 4]
    assert "window_reads" not in result and "HybridLinearAttnBackend" in result["window_reads_skipped"]
    assert dryrun.disagreements(plan, result) == []
    assert codes(spec, plan, result) == []


@needs_sglang
def test_a_predicted_refusal_is_confirmed_without_a_second_finding():
    spec = spec_of(MODELS / "Qwen__Qwen2.5-7B-Instruct")
    plan, result = dry(spec, context_length=65536)
    outcome = result["outcome"]
    assert not outcome["start"] and outcome["class"] == "ValueError" and outcome["step"] == "server_args"
    assert (outcome["class"], outcome["message"]) == (plan.refusals[0].error_class, plan.refusals[0].message)
    assert code_for(builtin_catalog(), "sglang", outcome["class"], outcome["message"]) == "SGL001"
    assert codes(spec, plan, result) == []  # the refusal rule reports SGL001 from the plan
    started = profile("sglang").plan(spec, SglangSettings())  # a plan that expects a start: stale
    found = dryrun_sglang.findings(spec, started, dryrun.record(started, result), builtin_catalog())
    assert [f.code for f in found] == ["SGL001", "SGL050"]  # the engine's error as observed, and the stale plan
    assert found[0].engine_error["message"] == outcome["message"] and found[0].engine_error["stage"] == "startup"


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    """MiMo-V2-Flash served with the torch_native attention backend."""
    d = tmp_path_factory.mktemp("mimo")
    (d / "config.json").write_text((REAL / "XiaomiMiMo__MiMo-V2-Flash.json").read_text())
    spec = spec_of(d)
    return (spec, *dry(spec, attention_backend="torch_native"))


@needs_sglang
def test_a_plan_that_disagrees_with_sglangs_start_up_is_reported_as_stale(mimo):
    """MiMo-V2-Flash: the static plan agrees with SGLang's own start-up (value buffers sized with v_head_dim,
    128, not head_dim, 192); a plan made for an fp8 KV cache, held against the run in bfloat16, is stale."""
    spec, plan, result = mimo
    assert result["outcome"] == {"start": True}
    assert "SGL050" not in codes(spec, plan, result)
    fp8 = profile("sglang").plan(spec, SglangSettings(attention_backend="torch_native", kv_cache_dtype="fp8_e4m3"))
    found = {f.code: f for f in dryrun_sglang.findings(spec, fp8, dryrun.record(fp8, result), builtin_catalog())}
    assert found["SGL050"].severity is None  # the catalog's (warning), filled in by the pipeline
    differences = found["SGL050"].evidence["differences"]
    assert "KV dtype: plan float8_e4m3fn, SGLang bfloat16" in differences  # fp8 buffers are stored as uint8
    assert "swa_kv_pool v_buffer per token: plan [8, 128] uint8, SGLang [8, 128] bfloat16" in differences
    assert json.loads(msgspec.json.encode(dryrun.record(fp8, result)))["differences"] == differences


@needs_sglang
def test_torch_native_reads_the_swa_buffer_at_full_pool_slots(mimo):
    spec, plan, result = mimo
    assert result["server_args"]["attention_backend"] == "torch_native"
    aligned = next(r for r in result["window_reads"] if r["window_left"] >= 0 and not r["after_swa_release"])
    assert (aligned["keys_read_max"], aligned["off_window_count"]) == (129, 0)  # the mask itself is right
    found = [f for f in dryrun_sglang.findings(spec, plan, dryrun.record(plan, result), builtin_catalog()) if f.code == "SGL051"]
    assert len(found) == 1 and found[0].layer == aligned["layer"]
    assert found[0].engine_error["class"] == "IndexError" and "full-pool slot numbers" in found[0].message


@needs_sglang
def test_torch_native_without_hybrid_swa_memory_reads_its_window(tmp_path):
    (tmp_path / "config.json").write_text((REAL / "XiaomiMiMo__MiMo-V2-Flash.json").read_text())
    spec = spec_of(tmp_path)
    plan, result = dry(spec, attention_backend="torch_native", disable_hybrid_swa_memory=True)
    assert result["outcome"] == {"start": True} and not result["model"]["is_hybrid_swa"]
    assert result["pools"]["token_to_kv_pool"]["class"] == "MHATokenToKVPool"  # sliding layers in the full pool
    # with hybrid-SWA off SGLang's runner window comes from attention_chunk_size (MiMo states both), so the
    # dry run does not read: it cannot tell a chunk from a window there, and says so
    assert result["model"]["runner_window_from"] == "attention_chunk_size"
    assert "chunked attention" in result["window_reads_skipped"]
    assert "SGL051" not in codes(spec, plan, result)


@needs_sglang
def test_gemma3_kept_out_of_hybrid_swa_memory_still_masks_its_window():
    """Gemma-3 is not on SGLang's hybrid-SWA allow-list: every layer is in the full pool, and the sliding
    layers must still read only their 512 keys (the plan's window), which the torch-native backend does."""
    spec = spec_of(MODELS / "google__gemma-3-1b-it")
    plan, result = dry(spec, attention_backend="torch_native")
    assert result["outcome"] == {"start": True} and not result["model"]["is_hybrid_swa"]
    assert result["server_args"]["attention_backend"] == "torch_native"  # SGL051's rule looks, and stays quiet
    assert result["pools"]["token_to_kv_pool"]["class"] == "MHATokenToKVPool"
    sliding, full = result["window_reads"]
    assert (sliding["sliding_from"], sliding["window_left"], sliding["keys_read_max"]) == ("plan", 511, 512)
    assert result["model"]["runner_window_from"] == "model_class"
    assert sliding["length"] > 512 and sliding["off_window_count"] == 0
    assert full["keys_read_max"] == full["length"] + 1
    assert codes(spec, plan, result) == []


@needs_sglang
def test_a_model_sglang_has_no_class_for_stops_where_the_plan_says(tmp_path):
    """Jamba: SGLang's own load-time architecture resolution refuses it (its Transformers fallback is not
    compatible), at the step the plan's SGL250 names, with the same text; GPT-NeoX falls back and starts."""
    (tmp_path / "jamba").mkdir()
    (tmp_path / "jamba" / "config.json").write_text(
        (ROOT / "fixtures" / "configs" / "fresh" / "ai21labs__AI21-Jamba-1.5-Mini.json").read_text())
    spec = spec_of(tmp_path / "jamba")
    plan, result = dry(spec)
    outcome = result["outcome"]
    assert not outcome["start"] and outcome["step"] == "model_arch"
    assert (outcome["class"], outcome["message"]) == (plan.refusals[0].error_class, plan.refusals[0].message)
    assert plan.refusals[0].code == "SGL250" and codes(spec, plan, result) == []
    (tmp_path / "neox").mkdir()
    (tmp_path / "neox" / "config.json").write_text(
        (ROOT / "fixtures" / "configs" / "fresh" / "togethercomputer__RedPajama-INCITE-Chat-3B-v1.json").read_text())
    neox_plan, neox = dry(spec_of(tmp_path / "neox"))
    assert neox["outcome"]["start"] and neox_plan.refusals == ()


@needs_sglang
def test_deepseek_v4_without_hybrid_swa_memory_is_sized_then_fails_building_its_pools(tmp_path):
    """SGL306: the plan predicts the TypeError SGLang's own DeepSeek-V4 pool raises after the sizing, and the dry
    run, which records it as a pool error, agrees; with hybrid-SWA memory on the plan predicts a start."""
    (tmp_path / "config.json").write_text((REAL / "deepseek-ai__DeepSeek-V4-Flash.json").read_text())
    spec = spec_of(tmp_path)
    plan, result = dry(spec, disable_hybrid_swa_memory=True, kv_budget="40GiB")
    assert result["outcome"]["start"] and "deepseek_v4_memory_pool.py" in result["pools_error"]["raised_at_sglang"]
    assert [r.code for r in plan.refusals] == ["SGL306"]
    assert (plan.refusals[0].error_class, plan.refusals[0].message) == (result["pools_error"]["class"],
                                                                        result["pools_error"]["message"])
    assert plan.facts.pools.budget["pools"] == {"full": result["sizing"]["max_total_num_tokens"]}
    assert dryrun.disagreements(plan, result) == []
    assert not profile("sglang").plan(spec, SglangSettings()).refusals
