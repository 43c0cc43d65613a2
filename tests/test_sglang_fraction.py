"""SGLang's memory defaults (`mem_fraction_static`, chunked prefill, the decode graphs' largest batch) as kvdoctor
models them (kvdoctor.engines.sglang.reserve), held to the release's own server-argument resolution for every real
config on CUDA GPUs and on Macs (goldens/sglang_fraction.json, made by goldens/sglang_fraction_oracle.py), and older
releases' (goldens/sglang_fraction-0.5.X.json: the oracle run with that release's venv). Their Mac points are held
from 0.5.22 only: MPS is not on the oracle's box, so before 0.5.22 (whose non-CUDA prefill default is off:
model_executor/cuda_graph_config.py default_prefill_backend) the torch.compile piecewise prefill graphs stay on there,
where a Mac's "non-CUDA hardware" rule turns them off (arg_groups/cuda_graph_hook.py
disable_tc_piecewise_cudagraph_if_incompatible @ 0.5.21)."""
from __future__ import annotations

import json

import pytest
from helpers import ROOT, make_model

from kvdoctor.engines.releases import key
from kvdoctor.engines.sglang import reserve
from kvdoctor.engines.sglang.profile import SglangProfile
from kvdoctor.errors import InputError
from kvdoctor.load.loader import load_model

PIECEWISE_OFF_SINCE = "0.5.22"  # the non-CUDA prefill default is off from here (see the module's docstring)
GOLDEN = json.loads((ROOT / "goldens" / "sglang_fraction.json").read_text())
RESOLVED = [{**p, "release": GOLDEN["versions"]["sglang"]} for p in GOLDEN["points"]
            if "mem_fraction_static" in p["result"]]
OLDER = [json.loads(path.read_text()) for path in sorted((ROOT / "goldens").glob("sglang_fraction-*.json"))]
RESOLVED += [{**p, "release": doc["versions"]["sglang"]} for doc in OLDER for p in doc["points"]
             if "mem_fraction_static" in p["result"] and (p["platform"] == "cuda" or key(doc["versions"]["sglang"]) >=
                                                          key(PIECEWISE_OFF_SINCE))]
REAL = ROOT / "fixtures" / "configs" / "real"


def test_the_goldens_cover_both_platforms() -> None:
    platforms = {p["platform"] for p in RESOLVED}
    assert platforms == {"cuda", "mps"} and len({p["model"] for p in RESOLVED}) >= 90
    assert OLDER and all(doc["versions"]["sglang"] != GOLDEN["versions"]["sglang"] for doc in OLDER)


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = {}
    root = tmp_path_factory.mktemp("fraction")
    for name in sorted({p["model"] for p in RESOLVED}):
        folder = make_model(root, json.loads((REAL / f"{name}.json").read_text()), checkpoint=False, dirname=name)
        try:
            spec = load_model(str(folder))
            out[name] = (spec, SglangProfile().budget_facts(spec))
        except InputError:
            out[name] = None
    return out


@pytest.mark.parametrize("point", RESOLVED, ids=lambda p: f"{p['release']}-{p['model']}-{p['platform']}-{p['gib']}-tp{p['tp']}")
def test_the_defaults_are_the_releases(point: dict, specs: dict) -> None:
    if specs[point["model"]] is None:
        pytest.skip("kvdoctor's budget does not price this model's layers")
    spec, facts = specs[point["model"]]
    want = point["result"]
    got = reserve.defaults(point["gib"] * 1024, tp=point["tp"], mla=bool(facts.mla_latent),
                           release=point["release"], cuda=point["platform"] == "cuda",
                           config=spec.raw_config)
    assert (got.chunked_prefill_size, got.cuda_graph_max_bs) == (want["chunked_prefill_size"], want["decode_max_bs"])
    assert got.mem_fraction_static == pytest.approx(want["mem_fraction_static"], abs=1e-9)


@pytest.mark.parametrize("name, reason", [
    ("moonshotai__Kimi-Linear-48B-A3B-Instruct", "KDA hybrid linear attention"),
    ("moonshotai__Kimi-K3", "KDA hybrid linear attention"),  # a validated multimodal arch, but KDA
    ("deepseek-ai__DeepSeek-V4-Flash", "DeepSeek-V4"),
    ("Qwen__Qwen3-VL-8B-Instruct", "multimodal model"),
    ("stepfun-ai__Step-3.7-Flash", "multimodal model"),  # its config class builds a vision tower and a text config
    ("Qwen__Qwen3.5-27B", None),  # multimodal, validated for breakable graphs
    ("google__gemma-3-27b-it", None),  # served text-only by default
    ("meta-llama__Llama-3.1-8B", None),
])
def test_the_prefill_graphs_go_off_for_the_releases_reasons(name: str, reason: str | None) -> None:
    config = json.loads((REAL / f"{name}.json").read_text())
    assert reserve.prefill_graphs_off(config) == reason
    d = reserve.defaults(81080, tp=1, config=config)
    assert (f"no prefill CUDA graphs ({reason})" in d.source) == (reason is not None)
    assert "no prefill CUDA graphs" not in reserve.defaults(81080, tp=1, config=config, cuda=False).source
