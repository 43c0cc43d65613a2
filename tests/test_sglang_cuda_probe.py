"""The pool probe: canaries through SGLang's own pool classes against the static plan.

The end-to-end cases need an interpreter with SGLang 0.5.23 and its dependencies
(KVDOCTOR_SGLANG_PYTHON, e.g. goldens/.venv/sglang/bin/python) and take about a minute each on a CPU;
without it they are skipped. The invariant logic itself is tested on synthetic observations.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvdoctor.engines.base import LayerPlan
from kvdoctor.engines.sglang import probe
from kvdoctor.engines.sglang.layout import plan_layers
from kvdoctor.engines.sglang.settings import SglangSettings as Settings
from kvdoctor.load.loader import load_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"


def planned(*placements):
    return [LayerPlan(index=i, engine_window=None, cache=pool, extra={"pool": pool, "pool_index": ix})
            for i, (pool, ix) in enumerate(placements)]


def test_invariants_hold_for_a_faithful_pool():
    seen = {"layers": {"0": {"hits": [["swa", 0]], "ptr": 10}, "1": {"hits": [["full", 0]], "ptr": 20}}}
    assert probe.invariants(seen, planned(("swa", 0), ("full", 0))) == {
        "reach": [], "unplanned_or_missing": [], "aliasing": [], "dense": []}


def test_invariants_report_a_misrouted_aliased_sparse_pool():
    seen = {"layers": {"0": {"hits": [["full", 1]], "ptr": 10}, "1": {"hits": [["full", 1]], "ptr": 10}}}
    got = probe.invariants(seen, planned(("full", 0), ("full", 1), ("full", 2)))
    assert got["reach"] == [{"layer": 0, "planned": ("full", 0), "landed": [("full", 1)]}]
    assert got["aliasing"] == [{"layer": 1, "same_buffer_as": 0}]
    assert got["dense"] == [{"pool": "full", "indices": [1, 1]}]
    assert got["unplanned_or_missing"] == [2]


@pytest.mark.skipif(probe.interpreter() is None, reason="set KVDOCTOR_SGLANG_PYTHON to an interpreter with SGLang")
@pytest.mark.parametrize("model", ["openai__gpt-oss-20b", "Qwen__Qwen3-Next-80B-A3B-Instruct",
                                   "moonshotai__Kimi-Linear-48B-A3B-Instruct"])
def test_canaries_reach_the_planned_buffers_in_sglangs_own_pools(tmp_path, model):
    shutil.copy(FIXTURES / model / "config.json", tmp_path / "config.json")
    layers, _, _ = plan_layers(load_model(str(tmp_path), with_checkpoint=False), Settings())
    seen = probe.observe(tmp_path, {}, probe.interpreter())
    assert seen["ok"], seen.get("error")
    assert probe.invariants(seen, layers) == {"reach": [], "unplanned_or_missing": [], "aliasing": [], "dense": []}


def test_startup_agreement_flags_a_stale_plan():
    from kvdoctor.engines.base import Refusal

    refusal = Refusal("SGL001", "ValueError", "too long", "startup")
    assert probe.startup_agreement({"ok": False, "error": {"class": "ValueError", "message": "too long"}},
                                   [refusal])["agree"]
    assert not probe.startup_agreement({"ok": True, "layers": {}}, [refusal])["agree"]
    assert not probe.startup_agreement({"ok": False, "error": {"class": "ValueError", "message": "x"}}, [])["agree"]


@pytest.mark.skipif(probe.interpreter() is None, reason="set KVDOCTOR_SGLANG_PYTHON to an interpreter with SGLang")
def test_dry_run_refusal_matches_the_static_plan(tmp_path):
    shutil.copy(FIXTURES / "Qwen__Qwen2.5-7B-Instruct" / "config.json", tmp_path / "config.json")
    settings = {"context_length": 65536}
    _, refusals, _ = plan_layers(load_model(str(tmp_path), with_checkpoint=False), Settings(**settings))
    seen = probe.observe(tmp_path, settings, probe.interpreter())
    assert probe.startup_agreement(seen, refusals) == {
        "engine": (refusals[0].error_class, refusals[0].message), "plan": (refusals[0].error_class,
                                                                          refusals[0].message), "agree": True}
