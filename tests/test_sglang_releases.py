"""The SGLang profile at each release against that release's own start-up code (goldens/sglang_check-<release>.json,
from `goldens/releases.py --check sglang==X`: every real config of fixtures/configs/real, unmutated, at the default
settings, TP 8 and fp8 KV, run through the release's ServerArgs, ModelConfig, KVCacheConfigurator and its pools; at
0.5.15 and 0.5.15.post1, which have no KVCacheConfigurator, ModelRunner's own sizing and pools).

Each point is judged as tools/sglang_agreement.py judges it (one reading of the goldens for both): the outcome
(start, or the refusal's class and exact text), every layer's pool and buffer index, the pool classes and buffer
shapes, the window decisions, and the 40 GiB sizing. KVDOCTOR_HELDOUT_REL=1 adds the sglang_check-*.json of
goldens/heldout-rel, heldout-rel3, heldout-rel4 and heldout-rel5, which measure the profile on configs it was not changed for and
are not part of the suite.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kvdoctor.engines.pins import PROFILED

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from sglang_agreement import judge  # noqa: E402
from test_sglang_cuda import KNOWN_GAPS  # noqa: E402 - what the profile does not model at any release

GOLDENS = Path(__file__).resolve().parent.parent / "goldens"
FILES = {path: json.loads(path.read_text()) for path in sorted(
    [*GOLDENS.glob("sglang_check-*.json"),
     *(GOLDENS.glob("heldout-rel*/sglang_check-*.json") if os.environ.get("KVDOCTOR_HELDOUT_REL") else ())])}
POINTS = [(doc["versions"]["sglang"], p) for doc in FILES.values() for p in doc["points"]
          if p["result"]["outcome"] not in ("not_applicable", "crash")]


@pytest.mark.parametrize("path", sorted(FILES), ids=lambda p: p.name)
def test_each_file_is_a_profiled_release_over_the_real_configs(path):
    doc = FILES[path]
    assert doc["versions"]["sglang"] in PROFILED["sglang"]
    assert doc["grid"] == "release"
    points = doc["points"]
    assert {p["setting"] for p in points} == {"default", "tp8", "fp8_kv"}
    assert not [p["model"] for p in points if p["result"]["outcome"] == "crash"]
    if path.parent == GOLDENS:
        real = {p.stem for p in (GOLDENS.parent / "fixtures" / "configs" / "real").glob("*.json")}
        assert {p["model"] for p in points} == real


# Differences a release's goldens found that are not release data yet (docs/versions.md says what each is); strict:
# an entry whose points pass is to be removed
RELEASE_GAPS = {
    ("0.5.17", "v11_deepseek-ai__deepseek-vl2-tiny"): "held-out (heldout-rel3): up to 0.5.18 ModelConfig keeps the "
                                                      "config's v_head_dim 0 (configs/model_config.py:864 @ 0.5.18 "
                                                      "replaces only None, :910 @ 0.5.19 also 0): a zero-width V "
                                                      "buffer; the pool geometry does not take a release yet",
}


def gap(point: dict, release: str) -> str | None:
    """The default release's known gap for this point (tests/test_sglang_cuda.py), or the release's own."""
    model, setting = point["model"], point["setting"]
    if (release, model) in RELEASE_GAPS:
        return RELEASE_GAPS[release, model]
    return next((KNOWN_GAPS[k] for test in ("plan", "budget")
                 for k in ((test, model, "none", setting), (test, model, "none"), (test, model)) if k in KNOWN_GAPS),
                None)


@pytest.mark.parametrize("release,point", [
    pytest.param(r, p, id=f"{r}-{p['model'].split('__')[-1]}-{p['setting']}",
                 marks=[pytest.mark.xfail(reason=gap(p, r), strict=(r, p["model"]) in RELEASE_GAPS)] if gap(p, r) else [])
    for r, p in POINTS])
def test_profile_at_the_release_matches_its_own_code(release, point, tmp_path):
    misses = {row: why for row, why in judge(point, tmp_path, release).items() if why is not None}
    assert not misses, misses


FRESH = GOLDENS.parent / "fixtures" / "configs" / "fresh"


@pytest.mark.parametrize("name,class_name", [("v9_mistralai__Mamba-Codestral-7B-v0.1", "Mamba2Config"),
                                             ("v9_tiiuae__falcon-mamba-7b", "FalconMambaConfig")])
def test_a_class_without_head_count_stops_model_config_up_to_0_5_19(name, class_name, tmp_path):
    """ModelConfig reads `num_attention_heads` as an attribute up to 0.5.19 (SGL296), with a default from 0.5.20."""
    from kvdoctor.engines.sglang.refusals import predict
    from kvdoctor.engines.sglang.settings import SglangSettings
    from kvdoctor.load.loader import load_model

    (tmp_path / "config.json").write_text((FRESH / f"{name}.json").read_text())
    spec = load_model(str(tmp_path), library_check=False)
    found = predict(spec, SglangSettings().at_release("0.5.19"))
    assert [(r.code, r.error_class, r.message) for r in found] == [
        ("SGL296", "AttributeError", f"'{class_name}' object has no attribute 'num_attention_heads'")]
    assert all(r.code != "SGL296" for r in predict(spec, SglangSettings().at_release("0.5.20")))
    llama = FRESH / "v9_meta-llama__Llama-2-13b-hf.json"
    (tmp_path / "config.json").write_text(llama.read_text())
    assert not predict(load_model(str(tmp_path), library_check=False), SglangSettings().at_release("0.5.17"))
