"""kvdoctor's budget calculators against the engines' own numbers.

The golden files in goldens/ were written by goldens/*_oracle.py, which call vLLM's, SGLang's and
mlx-lm's own sizing code on every config in fixtures/models over a grid of settings. These tests
never import an engine: they read the JSON and compare. Exact equality for block sizes, page
bytes, group layout, block counts, pool tokens, slots and max running requests; the same error
class and message where the engine refuses; concurrency within 1e-3.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from kvdoctor.engines.mlx_lm import budget as mlxlm
from kvdoctor.engines.sglang import budget as sglang
from kvdoctor.engines.vllm import budget as vllm
from kvdoctor.engines import profile
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "goldens"


def golden(name: str) -> dict:
    return json.loads((GOLDENS / f"{name}.json").read_text())


@lru_cache(maxsize=None)
def facts(model: str, engine: str):
    """The facts `kvdoctor budget` sizes for this engine (its profile's reading of the layers)."""
    spec = load_model(str(ROOT / "fixtures" / "models" / model), with_checkpoint=False)
    return profile(engine).budget_facts(spec), spec.config


def ids(points: list[dict]) -> list[str]:
    return [f"{p['model'].split('__')[-1]}-{i}" for i, p in enumerate(points)]


# vllm.json: the pinned release's points; vllm-<release>.json: each other release's (goldens/releases.py)
RELEASE_FILES = sorted(GOLDENS.glob("vllm-*.json"))
VLLM = golden("vllm")["points"]
VLLM_RELEASES = [(golden(path.stem)["versions"]["vllm"], point) for path in RELEASE_FILES
                 for point in golden(path.stem)["points"]]
SGLANG = golden("sglang")["points"]
SGLANG_RELEASES = [(golden(path.stem)["versions"]["sglang"], point) for path in sorted(GOLDENS.glob("sglang-*.json"))
                   for point in golden(path.stem)["points"]]
MLX = golden("mlx")["points"]


def test_goldens_cover_enough_points():
    assert len(VLLM) + len(SGLANG) + len(MLX) >= 200
    fixtures = {p.name for p in (ROOT / "fixtures" / "models").iterdir() if (p / "config.json").exists()}
    for points in (VLLM, SGLANG, MLX):
        assert {p["model"] for p in points} == fixtures


def test_goldens_record_engine_versions():
    """vllm.json holds the full grid of a profiled release, not necessarily the default one (each point is checked
    at the release the file records); the SGLang and mlx-lm files are their pinned releases'."""
    from kvdoctor.engines.pins import PROFILED

    assert golden("vllm")["versions"]["vllm"] in PROFILED["vllm"]
    assert golden("sglang")["versions"]["sglang"] == sglang.VERSION
    assert golden("mlx")["versions"]["mlx_lm"] == mlxlm.VERSION


@pytest.mark.parametrize("point", VLLM, ids=ids(VLLM))
def test_vllm_matches_engine(point):
    assert_vllm_point(point, golden("vllm")["versions"]["vllm"])


@pytest.mark.parametrize("release,point", VLLM_RELEASES,
                         ids=[f"{r}-{i}" for r, i in zip((r for r, _ in VLLM_RELEASES), ids([p for _, p in VLLM_RELEASES]))])
def test_vllm_release_matches_its_own_code(release, point):
    """Each profiled release against the points its own code wrote."""
    assert_vllm_point(point, release)


def test_every_release_file_is_a_profiled_release():
    from kvdoctor.engines.pins import PROFILED

    assert RELEASE_FILES, "no goldens/vllm-<release>.json"
    for path in [*RELEASE_FILES, *sorted(GOLDENS.glob("sglang-*.json"))]:
        doc = golden(path.stem)
        engine = doc["engine"]
        assert path.stem == f"{engine}-{doc['versions'][engine]}"
        assert doc["versions"][engine] in PROFILED[engine]
        planned = {p["model"] for p in doc["points"]}
        assert planned | set(doc.get("skipped", {})) == {p["model"] for p in (VLLM if engine == "vllm" else SGLANG)}
        assert len(doc.get("skipped", {})) <= 1, doc.get("skipped")  # a CPU-only stop, each with its reason


def assert_vllm_point(point: dict, release: str) -> None:
    s, want = point["settings"], point["result"]
    mode = vllm.Mode(max_model_len=s["max_model_len"], kv_budget_bytes=s["kv_budget_bytes"],
                     kv_cache_dtype=s["kv_cache_dtype"], tp=s["tp"], hma=s["hma"],
                     prefix_caching=s["prefix_caching"], num_speculative_tokens=s["num_speculative_tokens"],
                     max_num_batched_tokens=s["max_num_batched_tokens"], async_scheduling=s["async_scheduling"],
                     max_num_seqs=s["max_num_seqs"], release=release)
    got = vllm.plan(facts(point["model"], "vllm")[0], mode)
    if "error" in want and got.error is None:
        pytest.fail(f"vLLM refuses ({want['error']['message'][:120]}) but kvdoctor planned it")
    if "block_size" in want:
        assert got.mode.block_size == want["block_size"]
    if want.get("mamba_page_size_padded") is not None or got.state:
        assert got.state.padded_page_bytes == want["mamba_page_size_padded"]
    if "error" in want:
        assert got.error.cls == want["error"]["class"]
        assert got.error.message == want["error"]["message"]
        return
    assert got.error is None, got.error.message
    assert [(g.spec, g.layers, g.first_layer, g.block_size, g.page_bytes, g.window,
             g.blocks_per_request) for g in got.groups] == \
        [(g["spec"], g["layers"], g["first_layer"], g["block_size"], g["page_bytes"], g["window"],
          g["blocks_per_request"]) for g in want["groups"]]
    assert got.pool.bytes_per_block == want["bytes_per_block"]
    assert got.pool.num_blocks == want["num_blocks"]
    assert got.capacity.tokens == want["tokens"]
    assert got.capacity.max_concurrency == pytest.approx(want["max_concurrency"], abs=1e-3)


@pytest.mark.parametrize("point", SGLANG, ids=ids(SGLANG))
def test_sglang_matches_engine(point):
    assert_sglang_point(point, golden("sglang")["versions"]["sglang"])


@pytest.mark.parametrize("release,point", SGLANG_RELEASES,
                         ids=[f"{r}-{i}" for r, i in zip((r for r, _ in SGLANG_RELEASES),
                                                          ids([p for _, p in SGLANG_RELEASES]))])
def test_sglang_release_matches_its_own_code(release, point):
    assert_sglang_point(point, release)


def assert_sglang_point(point: dict, release: str) -> None:
    s, want = point["settings"], point["result"]
    mode = sglang.Mode(context_length=s["context_length"], kv_budget_bytes=s["kv_budget_bytes"],
                       page_size=s["page_size"], swa_full_tokens_ratio=s["swa_full_tokens_ratio"],
                       disable_hybrid_swa_memory=s["disable_hybrid_swa_memory"],
                       kv_cache_dtype=s["kv_cache_dtype"], tp=s["tp"],
                       max_mamba_cache_size=s["max_mamba_cache_size"],
                       mamba_full_memory_ratio=s["mamba_full_memory_ratio"], mamba_ssm_dtype=s["mamba_ssm_dtype"],
                       radix_cache=s["radix_cache"], max_running_requests=s["max_running_requests"],
                       max_total_tokens=s["max_total_tokens"], release=release)
    model_facts = facts(point["model"], "sglang")[0]
    got = sglang.plan(model_facts, mode)
    assert got.mode.hybrid_swa == (want.get("is_hybrid_swa", False) and model_facts.count("sliding") > 0)
    if "mamba_cache_per_req" in want:
        assert got.state is not None and got.state.bytes_per_slot == want["mamba_cache_per_req"]
        assert got.state.ssm_dtype == want["ssm_dtype"]
    if "error" in want:
        assert got.error is not None, f"SGLang refuses: {want['error']['message'][:120]}"
        assert (got.error.cls, got.error.message) == (want["error"]["class"], want["error"]["message"])
        return
    assert got.error is None, got.error.message
    if "max_mamba_cache_size" in want:
        assert got.state.slots == want["max_mamba_cache_size"]
        assert got.state.slots_per_request == want["mamba_ratio"]  # 5 on CUDA with extra_buffer, 1 without radix
    pools = {p.pool: p.tokens for p in got.pools}
    assert got.capacity.max_total_num_tokens == want["max_total_num_tokens"]
    if want["swa_max_total_num_tokens"] is not None:
        assert pools["full"] == want["full_max_total_num_tokens"]
        assert pools["swa"] == want["swa_max_total_num_tokens"]
    else:
        assert "swa" not in pools
    assert got.capacity.max_running_requests == want["max_running_requests"]


@pytest.mark.parametrize("point", MLX, ids=ids(MLX))
def test_mlx_matches_engine(point):
    s, want = point["settings"], point["result"]
    mode = mlxlm.Mode(context=s["context"], kv_budget_bytes=s["kv_budget_bytes"], max_kv_size=s["max_kv_size"],
                      kv_bits=s["kv_bits"], kv_group_size=s["kv_group_size"],
                      quantized_kv_start=s["quantized_kv_start"], prefill_step_size=s["prefill_step_size"])
    model_facts, config = facts(point["model"], "mlx-lm")
    got = mlxlm.plan(model_facts, mode, config)
    classes = {}
    for row in got.layer_kinds:
        name = row.cache + (f"({row.max_size},keep={4 if got.mode.max_kv_size_honored else 0})"
                            if row.cache == "RotatingKVCache" else "")
        classes[name] = classes.get(name, 0) + row.layers
    assert classes == want["caches"]
    if "error" in want:
        assert got.error is not None and (got.error.cls, got.error.message) == \
            (want["error"]["class"], want["error"]["message"])
        return
    assert got.error is None, got.error.message
    assert got.prefill.lengths == want["lengths"]
    assert got.capacity.per_request_bytes == want["bytes"]
    assert got.capacity.peak_prefill_bytes == want["peak_bytes"]
