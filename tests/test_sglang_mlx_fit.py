"""sglang's MLX backend in `kvdoctor fit`: the pool the runner auto-sizes, held to the engine's own
`_compute_pool_size` on every real config mlx-lm builds (goldens/sglang_mlx_pool.json, made by
goldens/sglang_mlx_pool_oracle.py), and the command a user runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, make_model, run

from kvdoctor.engines.sglang_mlx import fit as mlx_fit
from kvdoctor.engines.sglang_mlx.profile import SglangMlxProfile, SglangMlxSettings
from kvdoctor.load.loader import load_model

pytest.importorskip("mlx_lm", reason="sglang-mlx's layout is read from mlx-lm's classes (kvdoctor[mlx])")

GOLDEN = json.loads((ROOT / "goldens" / "sglang_mlx_pool.json").read_text())
SIZED = [p for p in GOLDEN["points"] if "pool_size" in p]
REAL = ROOT / "fixtures" / "configs" / "real"


def test_the_goldens_cover_many_models() -> None:
    assert GOLDEN["versions"]["sglang"] == "0.5.23" and len({p["model"] for p in SIZED}) >= 40


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each sized model's spec, facts and plan, from its config alone (the oracle's floats are the config's dtype)."""
    out = {}
    root = tmp_path_factory.mktemp("mlxpool")
    for name in sorted({p["model"] for p in SIZED}):
        spec = load_model(str(make_model(root, json.loads((REAL / f"{name}.json").read_text()), checkpoint=False,
                                         dirname=name)))
        profile = SglangMlxProfile()
        out[name] = (spec, profile.budget_facts(spec), profile.plan(spec, SglangMlxSettings()))
    return out


@pytest.mark.parametrize("point", SIZED, ids=lambda p: f"{p['model']}-{p['working_set'] >> 30}G")
def test_the_pool_is_the_engines(point: dict, plans: dict) -> None:
    """Sized at start-up, before any request (a refusal the plan predicts for the first request comes later)."""
    spec, facts, plan = plans[point["model"]]
    layout = plan.facts.layout
    first = (layout.full or layout.attention)[0]
    kv = plan.facts.kv[first]
    assert (kv.n_kv_heads, kv.head_dim, kv.dtype) == (point["n_kv_heads"], point["head_dim"], point["dtype"])
    assert (len(layout.full), len(layout.attention), len(layout.sliding)) == (
        point["full_layers"], point["attention_layers"], point["sliding_layers"])
    slot, _, note = mlx_fit.slot_bytes(plan, facts)
    budget = mlx_fit.kv_budget(point["working_set"], point["in_use"], point["mem_fraction_static"], point["available"])
    assert not note and mlx_fit.auto_pool(slot, budget) == point["pool_size"]


def test_a_model_the_engine_refuses_is_refused(tmp_path: Path) -> None:
    refused = [p for p in GOLDEN["points"] if p.get("error", {}).get("class") == "NotImplementedError"]
    name = refused[0]["model"]
    spec = load_model(str(make_model(tmp_path, json.loads((REAL / f"{name}.json").read_text()), checkpoint=False,
                                     dirname=name)))
    plan = SglangMlxProfile().plan(spec, SglangMlxSettings())
    assert plan.refusals and plan.refusals[0].message == refused[0]["error"]["message"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("mlxfit"), "llama-3.1-8b")


def _json(*args: str) -> tuple[int, dict]:
    proc = run("fit", *args, "--engine", "sglang-mlx", "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_fit_on_a_mac(llama: Path) -> None:
    rc, doc = _json(str(llama), "--gpu", "M-series-128GB", "--context", "32768", "--concurrency", "4")
    row = doc["rows"][0]
    terms = {t["name"]: t for t in row["terms"]}
    assert rc == 0 and row["fits"] and row["gpus"] == 1
    # 128 GB: the measured working set (107.52 GiB), sglang's default fraction for it on MPS (0.878: 8192-token
    # chunks and 256 decode graphs hold back 13,312 MiB; no prefill graphs off CUDA)
    assert "107.52 GiB" in terms["reserved"]["source"] and "0.878" in terms["reserved"]["source"]
    working_set = int(107.52 * (1 << 30))
    assert terms["reserved"]["bytes"] == (128 << 30) - int(working_set * 0.878)
    slot = 2 * 32 * 8 * 128 * 2  # 32 full layers, 8 KV heads of 128, bfloat16
    assert row["kv_tokens"] == (int(working_set * 0.878) - terms["weights"]["bytes"]) // slot
    assert terms["kv"]["bytes"] == (row["kv_tokens"] + 1) * slot  # the shared pool is allocated (no sliding layer)
    assert row["max_concurrency"] == pytest.approx(row["kv_tokens"] / 32768)
    assert row["launch"][:5] == ["env", "SGLANG_USE_MLX=1", "python", "-m", "sglang.launch_server"]
    assert row["launch"][-2:] == ["--mem-fraction-static", "0.878"]


def test_fit_follows_the_deploy_sections_working_set_and_refuses_too_long_a_context(llama: Path,
                                                                                 tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: sglang-mlx\nsglang_mlx:\n  working_set: 20GiB\n  mem_fraction_static: 0.8\n")
    rc, doc = _json(str(llama), "--gpu", "M-series-32GB", "--context", "131072", "--deploy", str(deploy))
    row = doc["rows"][0]
    assert rc == 1 and not row["fits"]
    assert row["kv_tokens"] == (int((20 << 30) * 0.8) - row["weights"]["bytes_per_rank"]) // (2 * 32 * 8 * 128 * 2)
    assert row["refusal"]["message"].startswith("context_length (131072) exceeds")
    proc = run("fit", str(llama), "--engine", "sglang-mlx", "--gpu", "M-series-32GB", "--gpus", "2")
    assert proc.returncode == 2 and "no layout of 2 GPU(s)" in proc.stderr


def test_a_sliding_window_model_gets_a_token_budget_and_no_pool(tmp_path: Path) -> None:
    model = make_model(tmp_path, "gpt-oss-20b")
    rc, doc = _json(str(model), "--gpu", "M-series-64GB", "--context", "8192")
    row = doc["rows"][0]
    kv = next(t for t in row["terms"] if t["name"] == "kv")
    assert "no shared pool is allocated" in kv["source"]
    assert any("outside the token budget" in note for note in row["notes"])


def test_a_model_the_runner_refuses_gets_its_text_and_no_pool(tmp_path: Path) -> None:
    model = make_model(tmp_path, "gemma-3-1b-it")  # mlx-lm's gemma3_text marks sliding layers with no window map
    rc, doc = _json(str(model), "--gpu", "M-series-64GB")
    row = doc["rows"][0]
    assert rc == 1 and row["refusal"]["class"] == "NotImplementedError"
    assert row["refusal"]["message"].startswith("Attention layer 0 declares sliding-window attention")
    assert row["kv_tokens"] is None and "kv" not in {t["name"] for t in row["terms"]}
    assert doc["recommendation"] is None


def test_check_gates_a_mac_deploy_on_the_same_answer(llama: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: sglang-mlx\nbudget:\n  gpu: M-series-32GB\n  context: 32768\n  concurrency: 1\n")
    greedy = run("check", str(llama), "--engine", "sglang-mlx", "--static", "--deploy", str(deploy), "--format", "json")
    found = [f for f in json.loads(greedy.stdout)["results"][0]["findings"] if f["code"] == "MEM016"]
    assert greedy.returncode == 1 and found and "exceeds the" in found[0]["message"]
    deploy.write_text(deploy.read_text().replace("M-series-32GB", "M-series-128GB"))
    fine = run("check", str(llama), "--engine", "sglang-mlx", "--static", "--deploy", str(deploy), "--format", "json")
    assert not [f for f in json.loads(fine.stdout)["results"][0]["findings"] if f["code"] == "MEM016"]
