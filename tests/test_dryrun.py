"""The dry run's parts that need no engine run: key counting, schedules, shrinking, the interpretation
of a child's events against a plan, and the catalog entries it emits."""
from __future__ import annotations

import json

import pytest

from helpers import real_config
from kvdoctor.catalog import builtin_catalog
from kvdoctor.engines.sglang_mlx.dryrun import shrink
from kvdoctor.engines.sglang_mlx.dryrun.driver import make_schedule
from kvdoctor.checks.dryrun_findings import Interpreter, cache_kind
from kvdoctor.engines.sglang_mlx.dryrun.instrument import keys_per_query, summarize
from kvdoctor.engines.sglang_mlx.dryrun.run import ChildOutcome
from kvdoctor.load.loader import load_model
from kvdoctor.engines.base import LayerPlan, Plan

mx = pytest.importorskip("mlx.core")


# -- counting attended keys -------------------------------------------------------------------------

def test_keys_per_query_for_each_mask_form():
    assert keys_per_query(2, 1, 5, None) == [[5], [5]]
    assert keys_per_query(1, 3, 7, "causal") == [[5, 6, 7]]
    band = mx.array([[True, True, False], [False, True, True]])
    assert keys_per_query(1, 2, 3, band) == [[2, 2]]
    additive = mx.array([[0.0, -float("inf"), 0.0]])
    assert keys_per_query(1, 1, 3, additive) == [[2]]
    padding = mx.array([True, True, True, False])[None, None, None, :]
    keep = mx.concatenate([padding, mx.ones((1, 1, 1, 4), dtype=mx.bool_)], axis=0)
    assert keys_per_query(2, 1, 4, keep) == [[3], [4]]


def test_summarize_tells_causal_window_and_w_plus_one_apart():
    assert summarize([[4, 5, 6]], [(3, 3)])["pattern"] == "causal"
    window = summarize([[4, 4, 4]], [(10, 3)])
    assert (window["pattern"], window["window"]) == ("window", 4)
    # one query attends W+1 keys while the others attend W: the off-by-one the engine guards against
    off = summarize([[4, 5, 4]], [(10, 3)])
    assert off["pattern"] == "irregular" and off["first_irregular"] == {"position": 10, "keys": 4}
    decode = summarize([[128], [127]], [(390, 1), (126, 1)])
    assert (decode["pattern"], decode["window"], decode["last_keys"]) == ("window", 128, [128, 127])


# -- schedules ---------------------------------------------------------------------------------------

def test_schedule_crosses_every_window_boundary():
    schedule = make_schedule(128, True, 8192)
    prefill = [(s.call, s.requests, s.lengths) for s in schedule.steps if s.stage == "prefill"]
    assert prefill == [("prefill", ["A"], [127]), ("extend", ["A"], [1]), ("extend", ["A"], [1]),
                       ("extend", ["A"], [128]), ("extend", ["A"], [133]), ("prefill", ["B"], [126])]
    assert [s.needs_logits for s in schedule.steps[:5]] == [False, False, False, False, True]
    decode = [s for s in schedule.steps if s.stage == "decode"]
    assert len(decode) == 4 and all(s.requests == ["A", "B"] for s in decode)
    assert schedule.tokens() == {"A": 394, "B": 130}


def test_schedule_splits_chunks_at_the_chunked_prefill_size():
    schedule = make_schedule(128, True, 100)
    lengths = [s.lengths[0] for s in schedule.steps if s.requests == ["A"]]
    assert max(lengths) == 100 and sum(lengths) == 390


# -- shrinking ----------------------------------------------------------------------------------------

def test_shrink_candidates_keep_head_geometry_explicit():
    cfg = real_config("llama-3.1-8b")
    (label, small), (_, full_hidden) = list(shrink.shrink_candidates(cfg))
    assert label == "small hidden size"
    assert small["hidden_size"] == shrink.SMALL_HIDDEN and small["head_dim"] == 4096 // 32
    assert small["vocab_size"] == shrink.SMALL_VOCAB and small["intermediate_size"] == shrink.SMALL_INTERMEDIATE
    assert small["num_attention_heads"] == 32 and small["num_key_value_heads"] == 8
    assert full_hidden["hidden_size"] == 4096 and "head_dim" not in cfg


def test_shrink_caps_experts_and_top_k():
    (_, small), _ = list(shrink.shrink_candidates(real_config("gpt-oss-20b")))
    assert small["num_local_experts"] == shrink.SMALL_EXPERTS
    assert small["num_experts_per_tok"] <= small["num_local_experts"]
    assert small["sliding_window"] == 128 and small["layer_types"] == real_config("gpt-oss-20b")["layer_types"]


def test_weightless_model_is_never_evaluated():
    model, _ = shrink.load_weightless(real_config("llama-3.1-8b"))
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    assert sum(v.nbytes for _, v in params) > 10 * 1024**3  # 8B parameters, described, not allocated
    assert mx.get_active_memory() < 1024**3


def test_randomize_is_seeded_and_scaled():
    cfg = json.loads(json.dumps(list(shrink.shrink_candidates(real_config("llama-3.1-8b")))[0][1]))
    a, _ = shrink.load_weightless(cfg)
    b, _ = shrink.load_weightless(cfg)
    shrink.randomize(a, 7)
    shrink.randomize(b, 7)
    wa, wb = a.model.layers[0].self_attn.q_proj.weight, b.model.layers[0].self_attn.q_proj.weight
    assert mx.array_equal(wa, wb).item()
    assert not mx.array_equal(wa, a.model.layers[1].self_attn.q_proj.weight).item()
    assert mx.abs(wa).max().item() <= wa.shape[-1] ** -0.5 + 1e-6


# -- interpreting a child's events --------------------------------------------------------------------

VERSIONS = {"event": "versions", "versions": {"sglang": "0.5.23", "mlx-lm": "0.32.2"}, "pinned": {},
            "modelled": []}


def _outcome(*events, done=True, **kw) -> ChildOutcome:
    tail = [{"event": "done", "seconds": 1.0}] if done else []
    return ChildOutcome(events=[VERSIONS, *events, *tail], returncode=0 if done else -9, **kw)


def _layout(windows):
    return {"event": "layout", "when": "after first prefill", "aot_kernels": [],
            "layers": [{"index": i, "attention_attr": "self_attn", "engine_window": w,
                        "cache": "WindowedAttentionKVCache" if w else "ContiguousAttentionKVCache"}
                       for i, w in enumerate(windows)]}


def _attention(layer, pattern, window=None, max_keys=4, stage="decode"):
    call = {"event": "attention", "layer": layer, "stage": stage, "step": 6, "pattern": pattern,
            "max_keys": max_keys, "last_keys": [max_keys], "positions": [[10, 10]]}
    if window:
        call["window"] = window
    return call


def _stages(*names):
    return [{"event": "stage", "stage": n, "status": s} for n in names for s in ("started", "ok")]


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    from helpers import make_model

    return load_model(str(make_model(tmp_path_factory.mktemp("m"), "gpt-oss-20b", checkpoint=False)))


def _plan(windows, engine="sglang-mlx"):
    layers = [LayerPlan(i, w, "windowed" if w else "contiguous") for i, w in enumerate(windows)]
    return Plan(engine=engine, versions={}, layers=tuple(layers))


def _codes(findings):
    return [f.code for f in findings]


def test_clean_run_agreeing_with_the_plan_has_no_findings(spec):
    outcome = _outcome(*_stages("load", "startup", "prefill", "decode"), _layout([4, None]),
                       _attention(0, "window", 4), _attention(1, "causal", max_keys=11), {"event": "finished"})
    findings, observed = Interpreter(outcome, spec, _plan([4, None]), builtin_catalog()).interpret()
    assert findings == []
    assert observed["outcome"] == "clean" and observed["stages"]["decode"] == "ok"
    assert observed["layers"][0]["decode_keys"] == [[4]]


def test_plan_disagreements_are_stale_findings(spec):
    outcome = _outcome(*_stages("load", "startup", "prefill", "decode"), _layout([4, None]),
                       _attention(0, "window", 5, max_keys=5), _attention(1, "causal", max_keys=11))
    findings, _ = Interpreter(outcome, spec, _plan([4, 4]), builtin_catalog()).interpret()
    stale = [f for f in findings if f.code == "ENG057"]
    aspects = sorted(f.evidence["aspect"] for f in stale)
    assert aspects == ["cache", "keys", "window"]
    keys = next(f for f in stale if f.evidence["aspect"] == "keys")
    assert [d["layer"] for d in keys.evidence["disagreements"]] == [0, 1]
    assert "sglang 0.5.23" in keys.message


def test_known_engine_error_gets_its_catalog_code(spec):
    error = {"event": "error", "stage": "startup", "class": "ValueError",
             "message": "No attention attribute in layer type <class 'mlx_lm.models.phi3.TransformerBlock'>",
             "frame": {"file": "sglang/srt/hardware_backend/mlx/kv_cache/model_patching.py", "line": 40,
                       "function": "find_attention_layers"}, "origin": {}}
    findings, observed = Interpreter(_outcome(*_stages("load"), error), spec, _plan([4, None]),
                                     builtin_catalog()).interpret()
    codes = _codes(findings)
    assert "ENG003" in codes  # named by the catalog's triage pattern
    assert "ENG057" in codes  # the plan predicted a clean start
    eng = findings[codes.index("ENG003")]
    assert eng.engine_error == {"class": "ValueError", "message": error["message"], "stage": "startup"}
    assert observed["stages"] == {"load": "ok", "startup": "error", "prefill": "not run", "decode": "not run"}


def test_unknown_engine_error_carries_text_and_frame(spec):
    error = {"event": "error", "stage": "decode", "class": "ValueError", "message": "something new broke",
             "frame": {"file": "sglang/srt/hardware_backend/mlx/model_runner.py", "line": 1537,
                       "function": "_decode_with_batched_attention"}, "origin": {}, "layer": 3}
    findings, _ = Interpreter(_outcome(error), spec, _plan([4, None]), builtin_catalog()).interpret()
    assert _codes(findings) == ["ENG051"]
    f = findings[0]
    assert "something new broke" in f.message and "model_runner.py:1537" in f.message
    assert f.layer == 3 and f.evidence["frame"]["function"] == "_decode_with_batched_attention"


def test_harness_failures_are_not_blamed_on_the_engine(spec):
    error = {"event": "error", "stage": "prefill", "class": "KeyError", "message": "'A'", "frame": None,
             "origin": {"file": "/x/kvdoctor/engines/sglang_mlx/dryrun/driver.py", "line": 1, "function": "_drive"}}
    findings, _ = Interpreter(_outcome(error), spec, _plan([4, None]), builtin_catalog()).interpret()
    assert _codes(findings) == ["ENG058"]


def test_a_load_step_the_weightless_copy_cannot_satisfy_is_kvdoctors_limit(spec):
    harness = {"event": "harness", "stage": "load", "step": "mlx_lm.models.kimi_k25.Model.sanitize",
               "class": "TypeError", "message": "pop expected at most 1 argument, got 2"}
    outcome = _outcome(*_stages("load", "startup", "prefill", "decode"), harness, _layout([4, None]),
                       _attention(0, "window", 4), _attention(1, "causal", max_keys=11))
    findings, observed = Interpreter(outcome, spec, _plan([4, None]), builtin_catalog()).interpret()
    assert _codes(findings) == ["ENG061"]  # a warning about kvdoctor; the run went on and agreed with the plan
    assert findings[0].evidence["step"].endswith("sanitize") and observed["stages"]["decode"] == "ok"


def test_weightless_copy_passes_a_sanitize_that_needs_weights():
    """mlx-lm 0.32.2's Kimi K2.5 sanitize pops keys from the unflattened weights: on no weights
    that is a list and raises TypeError; the weightless copy records it and builds the model."""
    from helpers import ROOT

    cfg = json.loads((ROOT / "fixtures/configs/real/moonshotai__Kimi-K2.5.json").read_text())
    limits = []
    model, _ = shrink.load_weightless(next(shrink.shrink_candidates(cfg))[1], limits=limits)
    assert len(model.layers) == 61
    assert [(l["step"], l["class"]) for l in limits] == [("mlx_lm.models.kimi_k25.Model.sanitize", "TypeError")]
    import mlx_lm.models.kimi_k25 as kimi_k25

    assert kimi_k25.Model.sanitize.__name__ == "sanitize"  # the class is restored after loading
    limits = []
    shrink.load_weightless(real_config("llama-3.1-8b"), limits=limits)
    assert limits == []


def test_runs_cut_short_say_why(spec):
    catalog = builtin_catalog()
    timeout = _outcome(*_stages("load", "startup"), {"event": "stage", "stage": "prefill", "status": "started"},
                       done=False, timed_out=True, timeout=3.0)
    findings, observed = Interpreter(timeout, spec, None, catalog).interpret()
    assert _codes(findings) == ["ENG055"] and observed["stages"]["prefill"] == "stopped"
    crash = _outcome(done=False, stderr_tail="Killed\n")
    assert _codes(Interpreter(crash, spec, None, catalog).interpret()[0]) == ["ENG056"]
    refused = _outcome({"event": "refused", "reason": "shrink", "stage": "load", "diff": ["layer 0 head_dim: 128 -> 2"]})
    assert _codes(Interpreter(refused, spec, None, catalog).interpret()[0]) == ["ENG052"]
    missing = ChildOutcome(events=[{"event": "engine_unavailable", "reason": "not installed: sglang"}])
    findings, observed = Interpreter(missing, spec, None, catalog).interpret()
    assert _codes(findings) == ["ENG050"] and observed == {"engine": "sglang-mlx", "ran": False,
                                                          "outcome": "unavailable", "reason": "not installed: sglang"}


def test_a_short_schedule_on_a_windowed_model_is_reported(spec):
    skipped = {"event": "schedule", "unit": 4096, "crosses_windows": True, "windows": [4096], "chosen": False,
               "estimated_seconds": 9e4, "peak_bytes": 2**34, "budget_seconds": 45.0, "steps": []}
    ran = dict(skipped, unit=8, crosses_windows=False, chosen=True, estimated_seconds=4.0, peak_bytes=2**20)
    findings, observed = Interpreter(_outcome(skipped, ran), spec, None, builtin_catalog()).interpret()
    assert _codes(findings) == ["ENG054"]
    assert observed["schedule"]["unit"] == 8


def test_cache_kinds_use_the_plan_labels():
    assert cache_kind("WindowedAttentionKVCache") == "windowed"
    assert cache_kind("ContiguousAttentionKVCache") == "contiguous"
    assert cache_kind("ArraysCache") == "native" and cache_kind(None) == "none"


def test_every_code_the_dry_run_emits_is_catalogued():
    from kvdoctor.checks import rule_modules_by_code

    catalog = builtin_catalog()
    for code in ("ENG050", "ENG051", "ENG052", "ENG053", "ENG054", "ENG055", "ENG056", "ENG057", "ENG058",
                 "ENG059", "ENG060", "ENG061", "ENG062"):
        entry = catalog[code]
        assert "kvdoctor.checks.dryrun" in rule_modules_by_code()[code]
        assert any(e.name == "sglang-mlx" for e in entry.engines)
