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
from kvdoctor.check import Options, check_target
from kvdoctor.dryrun.engine_import import missing_packages
from kvdoctor.selection import Selection

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
    code = ("import sys, json; from kvdoctor.dryrun.engine_import import load_mlx_backend; b = load_mlx_backend(); "
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
    rows = {row["index"]: row for row in run["layers"]}
    assert len(rows) == 24
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
    from kvdoctor.dryrun.run import ChildOutcome
    from kvdoctor.engines import profile
    from kvdoctor.loader import load_model

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
    assert run["error"]["frame"]["file"] == "sglang/srt/hardware_backend/mlx/model_runner.py"
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
    # the text is the full head count's (40 x 128), from a repeat on the first 4 layers (3 sliding, 1 full)
    assert run["error"]["confirmed_on"] == "the first 4 layers with the full head count"
    assert len(run["layers"]) == 64 and run["shrink"]["candidate"].endswith("1/8 of the heads")
    # the 4096-token window is too costly to cross on CPU: the short schedule is reported
    assert "ENG054" in [f.code for f in result.findings]
    assert all(row["cache"] == ("WindowedAttentionKVCache" if (row["index"] + 1) % 4 else "ContiguousAttentionKVCache")
               for row in run["layers"])


def test_an_error_of_the_engines_layer_discovery_needs_no_full_head_repeat(tmp_path):
    result = dry_check(make_model(tmp_path, "phi3-mini", checkpoint=False))
    run = result.info["dry_run"]
    assert run["error"]["message"] == "No attention attribute in layer type <class 'mlx_lm.models.phi3.TransformerBlock'>"
    assert run["shrink"]["candidate"] == "hidden size of the heads, 1/32 of the heads"  # not the full 3072
    assert "confirmed_on" not in run["error"] and "ENG003" in [f.code for f in result.findings]


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
    result = dry_check(make_model(tmp_path, "gpt-oss-20b", checkpoint=False), dry_run_timeout=1.5)  # under the import alone
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
    assert run["pool"]["buffers"] == 32  # the engine's shared pool: one buffer per full-attention layer


def test_a_copy_whose_weights_pass_the_memory_bound_is_never_filled(tmp_path):
    """Nemotron-Super-49B's layer widths come from block_configs (ffn_mult), which the shrink leaves
    alone: the copy that keeps every layer holds tens of GiB of weights. The dry run used to fill them
    and take all the machine's memory before it crashed; it now stops after loading and says why."""
    from pathlib import Path

    real = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "real"
    model = tmp_path / "nemotron-super"
    model.mkdir()
    (model / "config.json").write_text((real / "nvidia__Llama-3_3-Nemotron-Super-49B-v1.json").read_text())
    result = dry_check(model)
    run = result.info["dry_run"]
    assert run["outcome"] == "refused" and run["stages"]["load"] == "refused", run["stages"]
    assert run["stages"]["startup"] == "not run"
    found = [f for f in result.findings if f.code == "ENG053"]
    assert len(found) == 1 and found[0].evidence["weight_bytes"] > found[0].evidence["budget_bytes"]
    assert any("without --dry-run" in fix for fix in found[0].fixes)  # not only "raise the time budget"
    assert "ENG056" not in {f.code for f in result.findings}  # no crash


def test_missing_engine_is_one_finding_and_static_checks_still_run(tmp_path, monkeypatch):
    from kvdoctor.dryrun import engine_import

    monkeypatch.setitem(engine_import.REQUIRED_MODULES, "kvdoctor_no_such_engine", "no-such-engine")
    result = dry_check(make_model(tmp_path, "gemma-3-1b-it", checkpoint=False))
    codes = [f.code for f in result.findings]
    assert "ENG050" in codes and "ENG004" in codes
    assert result.info["dry_run"] == {"ran": False, "outcome": "unavailable",
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
