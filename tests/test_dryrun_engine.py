"""The dry run on the real engine: sglang 0.5.23's MLX runner with mlx-lm 0.32.2, on real configs.

Each run happens in a child process, as in use; a module fixture runs each model once and the tests
read its result. These are the slow tests of the dry run (a minute or so each on a 2-core box).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import make_model
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.engines.sglang_mlx.dryrun.engine_import import missing_packages
from kvdoctor.engines.sglang_mlx.dryrun.run import close_warm
from kvdoctor.checks.selection import Selection

pytestmark = pytest.mark.skipif(bool(missing_packages()),
                                reason=f"engine not installed: {', '.join(missing_packages())}")


def dry_check(model_dir, **extra):
    opts = Options(catalog=builtin_catalog(), engine="sglang-mlx", selection=Selection(select=("ALL",)),
                   extra={"dry_run": True, **extra})
    result = check_target(str(model_dir), opts)
    assert result.error is None, result.error
    return result


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return dry_check(make_model(tmp_path_factory.mktemp("gpt"), "gpt-oss-20b", checkpoint=False))


def test_engine_modules_load_without_the_whole_package():
    code = ("import sys, json; from kvdoctor.engines.sglang_mlx.dryrun.engine_import import load_mlx_backend; b = load_mlx_backend(); "
            "print(json.dumps({'runner': b.model_runner.__file__, 'pkg_init': sys.modules['sglang'].__file__, "
            "'triton': 'triton' in sys.modules, 'lang': 'sglang.lang' in sys.modules, "
            "'pool': getattr(sys.modules['sglang.srt.mem_cache.memory_pool'], 'KVDOCTOR_STAND_IN', False), "
            "'versions': b.versions}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.splitlines()[-1])
    assert info["runner"].endswith("sglang/srt/hardware_backend/mlx/model_runner.py")
    assert info["pkg_init"] is None and not info["triton"] and not info["lang"] and info["pool"]
    assert info["versions"]["sglang"] == "0.5.23" and info["versions"]["mlx-lm"] == "0.32.2"


def test_gpt_oss_runs_clean_and_sliding_layers_attend_exactly_the_window(gpt_oss):
    run = gpt_oss.info["dry_run"]
    assert run["outcome"] == "clean", run.get("error")
    assert run["stages"] == {"load": "ok", "startup": "ok", "prefill": "ok", "decode": "ok"}
    assert run["schedule"]["crosses_windows"] and run["schedule"]["unit"] == 128
    # the copy keeps each kind of layer twice: two sliding and two full of the 24, in the model's order
    assert run["shrink"]["layers"] == {"kept": 4, "of": 24}
    assert run["shrink"]["changes"]["layer_types"] == ["24 entries", "the first 4"]
    rows = {row["index"]: row for row in run["layers"]}
    assert sorted(rows) == [0, 1, 2, 3]
    for index, row in rows.items():
        sliding = index % 2 == 0
        assert row["cache"] == ("WindowedAttentionKVCache" if sliding else "ContiguousAttentionKVCache")
        assert row["engine_window"] == (128 if sliding else None)
        if sliding:
            # request A is past the window; B (126 tokens prefilled) reaches it on its second decode step
            assert row["decode_keys"] == [[128, 127], [128, 128], [128, 128], [128, 128]]
            assert row["prefill_max_keys"] == 128 and row["prefill_window"] == 128
        else:
            assert row["decode_keys"] == [[391, 127], [392, 128], [393, 129], [394, 130]]
            assert row["prefill_max_keys"] == 390
    assert not [f for f in gpt_oss.findings if f.code.startswith("ENG05")]  # agrees with the static plan


def test_gpt_oss_report_names_the_engine_code_that_ran(gpt_oss):
    run = gpt_oss.info["dry_run"]
    ran = run["engine_code"]
    runner = ran["sglang/srt/hardware_backend/mlx/model_runner.py"]
    for function in ("MlxModelRunner.__init__", "MlxModelRunner.prefill", "MlxModelRunner.extend",
                     "MlxModelRunner.decode_batch", "MlxModelRunner._decode_with_batched_attention"):
        assert function in runner
    assert "MLXAttentionWrapper._batched_decode" in ran["sglang/srt/hardware_backend/mlx/kv_cache/attention_wrapper.py"]
    assert "mlx_lm/models/gpt_oss.py" in ran
    assert any("stand-in" in line for line in run["modelled"])
    assert run["versions"]["sglang"] == "0.5.23"


def test_stale_plan_is_reported_against_a_real_run(gpt_oss):
    """Hold the real run against a plan that is wrong about one layer's window."""
    from msgspec.structs import replace

    from kvdoctor.checks.dryrun_findings import Interpreter
    from kvdoctor.engines.sglang_mlx.dryrun.run import ChildOutcome
    from kvdoctor.engines import profile
    from kvdoctor.load.loader import load_model

    spec = load_model(gpt_oss.target)
    sglang_mlx = profile("sglang-mlx")
    plan = sglang_mlx.plan(spec, sglang_mlx.Settings())
    layers = list(plan.layers)
    layers[1] = replace(layers[1], engine_window=128)  # a full layer the plan wrongly thinks slides
    plan = replace(plan, layers=tuple(layers))
    outcome = ChildOutcome(events=_events_of(gpt_oss), returncode=0)
    findings, _ = Interpreter(outcome, spec, plan, builtin_catalog()).interpret()
    stale = {f.evidence["aspect"]: f for f in findings if f.code == "ENG057"}
    assert set(stale) == {"window", "keys"}
    assert stale["window"].layer == 1 and stale["keys"].layer == 1


def _events_of(result):
    """Rebuild the events a finished run reported (layout and attention) from its observations."""
    run = result.info["dry_run"]
    layout = {"event": "layout", "aot_kernels": [], "layers": [
        {"index": r["index"], "attention_attr": "self_attn", "engine_window": r["engine_window"], "cache": r["cache"]}
        for r in run["layers"]]}
    calls = [{"event": "attention", "layer": r["index"], "stage": "decode", "step": 9,
              "pattern": "window" if r["engine_window"] else "causal", "window": r["engine_window"],
              "max_keys": max(r["decode_keys"][-1]), "last_keys": r["decode_keys"][-1], "positions": []}
             for r in run["layers"]]
    stages = [{"event": "stage", "stage": s, "status": "ok"} for s in ("load", "startup", "prefill", "decode")]
    return [{"event": "versions", "versions": run["versions"]}, *stages, layout, *calls,
            {"event": "finished"}, {"event": "done"}]


def test_gemma3_refusal_is_confirmed_not_duplicated(tmp_path):
    result = dry_check(make_model(tmp_path, "gemma-3-1b-it", checkpoint=False))
    run = result.info["dry_run"]
    assert run["error"]["class"] == "NotImplementedError" and run["error"]["stage"] == "startup"
    assert run["error"]["message"].startswith("Attention layer 0 declares sliding-window attention")
    assert run["error"]["frame"].startswith("sglang/srt/hardware_backend/mlx/model_runner.py:")
    assert run["confirms_plan_refusal"] == "ENG004"
    codes = [f.code for f in result.findings]
    assert codes.count("ENG004") == 1 and "ENG057" not in codes and "ENG051" not in codes


def test_olmo3_fails_its_first_batched_decode(tmp_path):
    result = dry_check(make_model(tmp_path, "olmo3", checkpoint=False))
    run = result.info["dry_run"]
    assert run["stages"] == {"load": "ok", "startup": "ok", "prefill": "ok", "decode": "error"}
    found = [f for f in result.findings if f.code == "ENG060"]
    assert len(found) == 1
    assert found[0].engine_error == {
        "class": "ValueError", "stage": "decode",
        "message": "[rms_norm] (*weight) must have the same size as the last dimension of x but has 5120 elements."}
    assert found[0].evidence["frame"]["function"] == "_batched_decode"
    assert found[0].layer == 0  # the first attention layer's wrapper raised
    # the copy with 1/8 of the heads raised it first; the text is the full head count's (40 x 128), from
    # the repeat with every head on the same 8 of the 64 layers (3 sliding, 1 full, twice), and the
    # finding says which copy raised it
    assert run["shrink"]["candidate"] == run["error"]["copy"] == "small hidden size, the first 8 of 64 layers"
    assert len(run["layers"]) == 8 and run["shrink"]["layers"] == {"kept": 8, "of": 64}
    assert "raised on kvdoctor's shrunk copy (small hidden size, the first 8 of 64 layers)" in found[0].message
    # the 4096-token window is too costly to cross on CPU: the short schedule is reported
    assert "ENG054" in [f.code for f in result.findings]
    assert all(row["cache"] == ("WindowedAttentionKVCache" if (row["index"] + 1) % 4 else "ContiguousAttentionKVCache")
               for row in run["layers"])


def test_an_error_of_the_engines_layer_discovery_needs_no_full_head_repeat(tmp_path):
    result = dry_check(make_model(tmp_path, "phi3-mini", checkpoint=False))
    run = result.info["dry_run"]
    assert run["error"]["message"] == "No attention attribute in layer type <class 'mlx_lm.models.phi3.TransformerBlock'>"
    # not the full 3072; and all 32 layers: mlx-lm's phi3 attention keeps num_hidden_layers, so a copy
    # cut to two layers would not show its layers' settings as the full model does (no cut is proven)
    assert run["shrink"]["candidate"] == "hidden size of the heads, 1/32 of the heads"
    assert run["shrink"]["layers"] == {"kept": 32, "of": 32}
    assert "copy" not in run["error"] and "ENG003" in [f.code for f in result.findings]


TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "vocab_size": 128, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
              "model_file": "custom_model.py"}
MODEL_FILE = """import os
from pathlib import Path
from mlx_lm.models.llama import Model, ModelArgs  # noqa: F401
Path(os.environ["KVDOCTOR_TEST_MARKER"]).write_text(str(os.getpid()))
"""


@pytest.fixture
def custom_model(tmp_path, monkeypatch):
    model = tmp_path / "custom"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    (model / "custom_model.py").write_text(MODEL_FILE)
    marker = tmp_path / "ran.txt"
    monkeypatch.setenv("KVDOCTOR_TEST_MARKER", str(marker))
    return model, marker


def test_model_code_is_refused_without_trust(custom_model):
    model, marker = custom_model
    result = dry_check(model)
    found = [f for f in result.findings if f.code == "ENG059"]
    assert len(found) == 1 and found[0].engine_error["stage"] == "load"
    assert not marker.exists()  # the checkpoint's code never ran


def test_trusted_model_code_runs_only_in_the_child(custom_model):
    model, marker = custom_model
    result = dry_check(model, trust_remote_code=True)
    run = result.info["dry_run"]
    assert run["outcome"] == "clean", run.get("error")
    assert marker.exists() and int(marker.read_text()) != os.getpid()
    assert "custom_model" not in sys.modules
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "custom_model.py"]  # nothing written there


def test_time_bound_kills_the_run_and_keeps_what_it_saw(tmp_path):
    close_warm()  # a cold child, so that the bound falls inside the engine's import
    # a bound no machine can meet: the cold child is killed inside the engine's import, however fast it is
    result = dry_check(make_model(tmp_path, "gpt-oss-20b", checkpoint=False), dry_run_timeout=0.001)
    run = result.info["dry_run"]
    codes = [f.code for f in result.findings]
    assert "ENG055" in codes
    assert run["outcome"] == "timeout" and "not run" in run["stages"].values()


def test_over_budget_checks_startup_and_says_so(tmp_path):
    result = dry_check(make_model(tmp_path, "llama-3.1-8b", checkpoint=False), dry_run_budget=0.001)
    run = result.info["dry_run"]
    assert run["stages"] == {"load": "ok", "startup": "ok", "prefill": "refused", "decode": "not run"}
    found = [f for f in result.findings if f.code == "ENG053"]
    assert len(found) == 1 and len(found[0].evidence["schedules"]) == 2
    assert all(not s["chosen"] for s in found[0].evidence["schedules"])
    # the engine's shared pool: one buffer per full-attention layer of the copy (2 of the 32)
    assert run["pool"]["buffers"] == run["shrink"]["layers"]["kept"] == 2


def _real_model(tmp_path, name):
    """A config-only model dir holding the published config fixtures/configs/real/NAME.json."""
    from pathlib import Path

    model = tmp_path / name
    model.mkdir()
    real = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "real"
    (model / "config.json").write_text((real / f"{name}.json").read_text())
    return model


def _nemotron_super(tmp_path, group_sizes=None):
    """Nemotron-Super-49B's published config; `group_sizes` overrides n_heads_in_group of its first
    attention blocks."""
    import json
    from pathlib import Path

    real = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "real"
    config = json.loads((real / "nvidia__Llama-3_3-Nemotron-Super-49B-v1.json").read_text())
    attention = [b["attention"] for b in config["block_configs"] if not b["attention"]["no_op"]]
    for block, size in zip(attention, group_sizes or []):
        block["n_heads_in_group"] = size
    model = tmp_path / "nemotron-super"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_nemotron_nas_runs_on_fewer_heads_and_meets_the_make_cache_count(tmp_path):
    """Nemotron-Super-49B gives each attention block its group size in block_configs and no
    num_key_value_heads: the copy keeps the group sizes with 1/8 of the query heads (one KV head a
    block) and the hidden size that gives back the head dim mlx-lm derives. Its no-op attention blocks
    get no cache from mlx-lm's make_cache(), which SGLang's MLX runner refuses at the first request;
    the plan says so (SGL120) and the engine's own code confirms it on the copy."""
    result = dry_check(_nemotron_super(tmp_path))
    run = result.info["dry_run"]
    assert run["shrink"]["candidate"] == "hidden size of the heads, 1/8 of the heads, the first 8 of 80 layers"
    assert run["shrink"]["changes"]["hidden_size"] == [8192, 1024]
    assert run["stages"]["startup"] == "ok" and run["stages"]["prefill"] == "error", run["stages"]
    assert run["error"]["message"] == "model.make_cache() returned 6 entries for 8 layers"
    assert run["confirms_plan_refusal"] == "SGL120"
    codes = [f.code for f in result.findings]
    assert codes.count("SGL120") == 1 and not {"ENG051", "ENG053", "ENG057"} & set(codes), codes
    [found] = [f for f in result.findings if f.code == "SGL120"]
    assert "returns 49 caches for the model's 80 layers" in found.message  # the full model's counts


def test_the_model_class_error_the_plan_read_is_confirmed_not_uncatalogued(tmp_path):
    """Qwen3-VL-8B: mlx-lm's qwen3_vl class cannot be built from the published config (ENG002, whose
    text is the class's own). The engine's loader raises the same exception; that confirms the plan
    rather than standing as an uncatalogued error (ENG051) and a stale plan (ENG057)."""
    model = _real_model(tmp_path, "Qwen__Qwen3-VL-8B-Instruct")
    result = dry_check(model)
    run = result.info["dry_run"]
    assert run["stages"]["load"] == "error" and run["error"]["class"] == "TypeError", run["stages"]
    assert run["confirms_plan_refusal"] == "ENG002"
    codes = [f.code for f in result.findings]
    assert codes.count("ENG002") == 1 and not {"ENG051", "ENG057"} & set(codes), codes


def test_llama4_calls_a_cache_method_the_backend_caches_lack(tmp_path, gpt_oss):
    """mlx-lm's Llama 4 trims its chunked caches before each forward pass (maybe_trim_front), a method
    the backend's own KV caches do not have: the first prefill fails (ENG062). gpt-oss stays quiet."""
    model = _real_model(tmp_path, "meta-llama__Llama-4-Scout-17B-16E-Instruct")
    result = dry_check(model)
    run = result.info["dry_run"]
    assert run["stages"]["startup"] == "ok" and run["stages"]["prefill"] == "error", run["stages"]
    [found] = [f for f in result.findings if f.code == "ENG062"]
    assert "'ContiguousAttentionKVCache' object has no attribute 'maybe_trim_front'" in found.message
    assert found.evidence["frame"]["file"] == "mlx_lm/models/llama4.py"
    assert "ENG051" not in {f.code for f in result.findings}
    assert "ENG062" not in {f.code for f in gpt_oss.findings}


def test_the_loader_refusal_of_an_fp8_checkpoint_is_confirmed(tmp_path):
    """Laguna-XS.2-FP8's compressed-tensors FP8: the plan predicts mlx-lm's loader refusal (ENG063),
    and the engine's own load raises it."""
    model = _real_model(tmp_path, "poolside__Laguna-XS.2-FP8")
    result = dry_check(model)
    run = result.info["dry_run"]
    assert run["stages"]["load"] == "error" and run["confirms_plan_refusal"] == "ENG063"
    codes = [f.code for f in result.findings]
    assert codes.count("ENG063") == 1 and not {"ENG051", "ENG057"} & set(codes), codes


def test_a_wrapper_error_the_probe_reported_is_not_reported_again(tmp_path):
    """Devstral-Small-2 (mlx-lm's ministral3) passes its attention more arguments than the backend's
    wrapper takes. The mask-routing probe reports it (ENG012) with the engine's own text, and the dry
    run, which meets the same TypeError at the first prefill, adds no uncatalogued error (ENG051)."""
    model = _real_model(tmp_path, "mistralai__Devstral-Small-2-24B-Instruct")
    result = dry_check(model)
    run = result.info["dry_run"]
    assert run["stages"]["prefill"] == "error" and run["error"]["class"] == "TypeError"
    [found] = [f for f in result.findings if f.code == "ENG012"]
    assert found.engine_error["message"] == run["error"]["message"] == \
        "MLXAttentionWrapper.__call__() takes from 2 to 4 positional arguments but 5 were given"
    assert "ENG051" not in {f.code for f in result.findings}


def test_an_error_in_the_first_requests_cache_list_belongs_to_prefill(tmp_path):
    """EXAONE-4.0-32B: its NoPE layers keep their own caches, so the runner asks mlx-lm's make_cache()
    for the first request's cache list, and that reads `self_attn.is_local`, which the wrapper lacks.
    The runner builds that list when a request arrives, so the error is the first prefill's, where
    the probe puts it (ENG012, once), not a start-up refusal the plan missed (ENG057)."""
    model = _real_model(tmp_path, "LGAI-EXAONE__EXAONE-4.0-32B")
    result = dry_check(model)
    run = result.info["dry_run"]
    assert run["stages"]["startup"] == "ok" and run["error"]["stage"] == "prefill", run["stages"]
    assert run["error"]["message"] == "'MLXAttentionWrapper' object has no attribute 'is_local'"
    codes = [f.code for f in result.findings]
    assert codes.count("ENG012") == 1 and "ENG057" not in codes, codes


def test_an_error_the_plan_did_not_read_keeps_no_code():
    from kvdoctor.checks.dryrun_findings import error_code
    from kvdoctor.engines.base import Plan, Refusal

    plan = Plan(engine="sglang-mlx", versions={}, layers=(),
                refusals=(Refusal("ENG002", "TypeError", "missing 1 required positional argument: 'x'", "load"),))
    error = {"class": "TypeError", "message": "missing 1 required positional argument: 'x'", "stage": "load"}
    assert error_code(error, plan, "sglang-mlx") == "ENG002"
    assert error_code({**error, "message": "missing 1 required positional argument: 'y'"}, plan, "sglang-mlx") is None
    assert error_code({**error, "stage": "startup"}, plan, "sglang-mlx") is None
    assert error_code(error, None, "sglang-mlx") is None


def test_a_copy_whose_weights_pass_the_memory_bound_is_never_filled(tmp_path):
    """With two group sizes among its attention blocks no one factor leaves one KV head a block, so
    the copy keeps every head and the full hidden size, whose block_configs widths (ffn_mult) hold GiB
    of weights even on 8 layers. The dry run used to fill them and take all the machine's memory; it
    stops after loading and says why."""
    result = dry_check(_nemotron_super(tmp_path, group_sizes=[8, 4]))
    run = result.info["dry_run"]
    assert run["outcome"] == "refused" and run["stages"]["load"] == "refused", run["stages"]
    assert run["stages"]["startup"] == "not run"
    found = [f for f in result.findings if f.code == "ENG053"]
    assert len(found) == 1 and found[0].evidence["weight_bytes"] > found[0].evidence["budget_bytes"]
    assert any("without --dry-run" in fix for fix in found[0].fixes)  # not only "raise the time budget"
    assert "ENG056" not in {f.code for f in result.findings}  # no crash


def test_missing_engine_is_one_finding_and_static_checks_still_run(tmp_path, monkeypatch):
    from kvdoctor.engines.sglang_mlx.dryrun import engine_import

    monkeypatch.setitem(engine_import.REQUIRED_MODULES, "kvdoctor_no_such_engine", "no-such-engine")
    result = dry_check(make_model(tmp_path, "gemma-3-1b-it", checkpoint=False))
    codes = [f.code for f in result.findings]
    assert "ENG050" in codes and "ENG004" in codes
    assert result.info["dry_run"] == {"engine": "sglang-mlx", "ran": False, "outcome": "unavailable",
                                      "reason": "not installed: no-such-engine"}


def test_html_report_draws_the_keys_each_layer_attended(gpt_oss, tmp_path):
    import re
    from pathlib import Path

    from kvdoctor.report import Report, render

    page = render(Report([gpt_oss], builtin_catalog(), Path(tmp_path)), "html")
    section = page[page.index("<h3>Dry run</h3>"):page.index("<h3>Findings</h3>")]
    prefill = dict(re.findall(r"<title>layer (\d+): most keys a prefill query attended ([\d,]+)", section))
    decode = dict(re.findall(r"<title>layer (\d+): most keys at a decode step ([\d,]+)", section))
    windows = re.findall(r"<title>layer (\d+): engine window ([\d,]+)</title></line>", section)
    rows = gpt_oss.info["dry_run"]["layers"]
    assert {int(k): int(v.replace(",", "")) for k, v in prefill.items()} == \
        {row["index"]: row["prefill_max_keys"] for row in rows}
    assert {int(k): int(v.replace(",", "")) for k, v in decode.items()} == \
        {row["index"]: max(max(step) for step in row["decode_keys"]) for row in rows}
    assert [int(i) for i, _ in windows] == [row["index"] for row in rows if row["engine_window"]]


# google/gemma-4-E2B-it's text_config as published (hidden sizes and vocabulary are shrunk anyway): its
# last 20 of 35 layers reuse the keys and values of earlier layers
GEMMA4_E2B = {
    "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 1536,
    "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": None, "attention_k_eq_v": False, "sliding_window": 512,
    "vocab_size": 262144, "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "intermediate_size": 6144,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
    "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                           "rope_type": "proportional"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
}


CUT_PROBE = """
import json, sys
from kvdoctor.engines.sglang_mlx.dryrun import compact, shrink
from kvdoctor.engines.sglang_mlx.dryrun.driver import DryRun
from kvdoctor.engines.sglang_mlx.dryrun.engine_import import load_mlx_backend
config = json.loads(sys.argv[1])
run = DryRun({"config": config}, print)
run.backend = load_mlx_backend()
full, _ = shrink.load_weightless(config)
full_sig = shrink.signature(full, run.backend)
_label, small = next(shrink.shrink_candidates(config))
uncut, _ = shrink.load_weightless(small)
cut = run._cut(small, uncut, compact.first_layers(full_sig, compact.layer_period(full_sig)), 1, None, None)
print(json.dumps(None if cut is None else cut[3]))
"""


# Ling-3.0-tiny's config.json (inclusionAI), as quoted in a public test of its MLX port: three KDA layers
# then one MLA layer a group, the first layer dense
LING3_TINY = {
    "architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "hidden_size": 1536,
    "intermediate_size": 4608, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 128, "vocab_size": 157184, "max_position_embeddings": 131072, "rms_norm_eps": 0.000001,
    "rope_theta": 6000000, "tie_word_embeddings": False, "layer_group_size": 4, "short_conv_kernel_size": 4,
    "no_kda_lora": True, "kda_safe_gate": True, "kda_lower_bound": -5,
    "gated_attention_proj_granularity_type": "head_wise", "qk_head_dim": 192, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "q_lora_rank": 256, "kv_lora_rank": 512, "rope_interleave": True,
    "use_qk_norm": True, "first_k_dense_replace": 1, "num_experts": 128, "num_experts_per_tok": 8,
    "num_shared_experts": 1, "moe_intermediate_size": 512, "moe_shared_expert_intermediate_size": 512, "n_group": 8,
    "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "moe_router_enable_expert_bias": True,
}


@pytest.mark.parametrize("config, kept", [
    ({**GEMMA4_E2B, "num_kv_shared_layers": 0}, 10),  # no layer depends on the count: each kind twice
    (GEMMA4_E2B, None),  # the last 20 share a cache: cut to 25, layers 5-24 would (the signature shows it)
    (LING3_TINY, 8),  # a dense KDA layer, then KDA and MLA layers of experts twice; layers past the last
    # whole group would be MLA (mlx-lm's bailing_moe_v3), and a cut to whole groups leaves none
], ids=["gemma4-no-sharing", "gemma4-e2b", "ling3-tiny"])
def test_a_cut_is_used_only_where_no_kept_layer_depends_on_the_count(config, kept):
    """The copy cut to its first layers must show each kept layer as the copy with every layer does:
    in its signature (classes, widths, windows) and in its own settings (flags, indices, sizes)."""
    out = subprocess.run([sys.executable, "-c", CUT_PROBE, json.dumps(config)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == kept


def test_a_layer_set_up_by_the_layer_count_shows_in_its_settings():
    """What the signature cannot see, the settings do: a flag or a size held by any module of a layer
    (not its arrays), so a layer built as the last one differs from the same layer mid-model."""
    import mlx.nn as nn

    from kvdoctor.engines.sglang_mlx.dryrun.shrink import layer_states

    class Block(nn.Module):
        def __init__(self, index: int, count: int):
            super().__init__()
            self.index = index
            self.attn = nn.Linear(4, 4)
            self.attn.scale = 1 - index / (count - 1)  # a decay that moves with the layer count

    full, cut = [Block(i, 24) for i in range(24)], [Block(i, 8) for i in range(8)]
    assert layer_states(full[:1]) == layer_states(cut[:1])  # layer 0 is alike in both
    assert layer_states(full[:8]) != layer_states(cut)
    assert "attn.scale=1.0" in layer_states(cut)[0] and "index=0" in layer_states(cut)[0]
