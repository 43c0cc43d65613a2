"""DeepSeek-V4's KV caches (kvdoctor/engines/vllm/dsv4.py) against what vLLM 0.34.0's own code built for the real
Flash and Pro configs (goldens/vllm_check-0.34.0.json: the worker's per-layer specs, the manager's groups).

DeepSeek-V4's block sizes and pages are its model class's own (not the platform's), so unlike the other goldens they
are compared exactly, not per token."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvdoctor.engines.vllm import dsv4
from kvdoctor.engines.vllm.profile import plan
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "goldens" / "vllm_check-0.34.0.json").read_text())
POINTS = {(p["model"].rsplit("-", 1)[1], p["setting"]): p for p in GOLDEN["points"]
          if p["model"].startswith("deepseek-ai__DeepSeek-V4") and p.get("layers")}
GiB = 1 << 30


def row(c: dsv4.Cache) -> tuple:
    return (f"model.layers.{c.index}.{c.name}", c.spec, c.block_size, c.page, c.head_size, c.dtype, c.window)


def golden_row(r: dict) -> tuple:
    return (r["name"], r["spec"], r["block_size"], r["page_size_bytes"], r["head_size"], r["dtype"], r["window"])


def test_the_golden_holds_both_models_with_and_without_hma():
    assert set(POINTS) == {("Flash", "default"), ("Flash", "hma_off"), ("Pro", "default"), ("Pro", "hma_off")}


@pytest.mark.parametrize("model,count", [("Flash", 167), ("Pro", 243)])
def test_specs_are_vllms(model, count):
    """Every cache vLLM's worker collected, in its order: name, spec class, block size, page, head size, dtype, window."""
    point = POINTS[(model, "default")]
    mine = [row(c) for c in dsv4.caches(point["config"])]
    assert len(mine) == count
    assert mine == [golden_row(r) for r in point["layers"]]
    assert {(r[1], r[2]) for r in mine} == {("SlidingWindowMLASpec", 64), ("MLAAttentionSpec", 256),
                                           ("SlidingWindowMLASpec", 4), ("SlidingWindowMLASpec", 8)}


@pytest.mark.parametrize("model", ["Flash", "Pro"])
@pytest.mark.parametrize("setting", ["default", "hma_off"])
def test_groups_are_vllms(model, setting):
    point = POINTS[(model, setting)]
    fields = point["fields"]
    sizing = dsv4.size(point["config"], point["hma"]["on"], fields["max_model_len"], fields["max_num_batched_tokens"])
    mine = sorted(sorted(f"model.layers.{c.index}.{c.name}" for c in g) for g in sizing.groups)
    assert mine == sorted(sorted(g["layer_names"]) for g in point["groups"])
    assert [g[0].block_size for g in sizing.groups] == [g["block_size"] for g in point["groups"]]
    assert len(sizing.groups) == (5 if setting == "default" else 1)


def test_admission_sizes_are_vllms():
    """The CPU box's scheduler (max_num_batched_tokens = max_model_len, no async scheduling) gives vLLM's figures."""
    want = {("Flash", "default"): "401.44", ("Flash", "hma_off"): "318.45",
            ("Pro", "default"): "575.17", ("Pro", "hma_off"): "464.42"}
    for key, point in POINTS.items():
        fields = point["fields"]
        sizing = dsv4.size(point["config"], point["hma"]["on"], fields["max_model_len"], fields["max_num_batched_tokens"])
        assert f"{round(sizing.needed / GiB, 2)}" == want[key]
        assert f"({want[key]} GiB KV cache is needed" in point["outcome"]["message"]


def load(tmp_path: Path, config: dict):
    model = tmp_path / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(config))
    return load_model(str(model), library_check=False)


def test_cuda_scheduler_fits_what_the_cpu_one_refuses(tmp_path):
    """The sliding caches hold the window plus the tokens in flight: two batches of 8192 on CUDA, the whole
    length on the CPU box, where vLLM refuses Flash at 1M tokens in 40 GiB."""
    spec = load(tmp_path, POINTS[("Flash", "default")]["config"])
    cuda = plan(spec, VllmSettings(kv_budget=40 * GiB))
    cpu = plan(spec, VllmSettings(kv_budget=40 * GiB, max_num_batched_tokens=1 << 20, async_scheduling=False))
    assert not cuda.refusals and len(cuda.facts.groups) == 5 and cuda.facts.unmodeled is None
    assert cpu.refusals[0].code == "MEM004"
    assert "estimated maximum model length is 104460" in cpu.refusals[0].message


def test_block_size_and_kv_dtype_settings_leave_its_caches_alone(tmp_path):
    spec = load(tmp_path, POINTS[("Pro", "default")]["config"])
    base = plan(spec, VllmSettings())
    for settings in (VllmSettings(block_size=32), VllmSettings(kv_cache_dtype="fp8")):
        assert [(l.extra["name"], l.extra["block_size"], l.extra["page_size_bytes"], l.extra["dtype"])
                for l in plan(spec, settings).layers] == [
            (l.extra["name"], l.extra["block_size"], l.extra["page_size_bytes"], l.extra["dtype"]) for l in base.layers]


@pytest.mark.parametrize("key,value,why", [
    ("compress_rates", {"compressed_sparse_attention": 8, "heavily_compressed_attention": 128},
     "DeepSeek-V4 compresses by 4 or 128, not 8"),
    ("compress_ratios", [0, 0] + [8] * 41 + [0], "compress_ratios holds 8, which names no DeepSeek-V4 layer type")])
def test_a_ratio_vllm_cannot_compress_by_is_left_to_the_dry_run(tmp_path, key, value, why):
    config = {**POINTS[("Flash", "default")]["config"], key: value}
    got = plan(load(tmp_path, config), VllmSettings())
    assert not got.refusals and not got.facts.groups
    assert got.facts.unmodeled == why
    healthy = plan(load(tmp_path / "twin", POINTS[("Flash", "default")]["config"]), VllmSettings())
    assert healthy.facts.unmodeled is None and len(healthy.facts.groups) == 5


def test_before_030_it_stays_unplanned(tmp_path):
    spec = load(tmp_path, POINTS[("Flash", "default")]["config"])
    got = plan(spec, VllmSettings().at_release("0.28.0"))
    assert got.facts.unmodeled and "0.30.0" in got.facts.unmodeled
    assert not any("engine_spec" in layer.extra for layer in got.layers)


def check_codes(model: Path, *args: str) -> list[str]:
    run = subprocess.run([sys.executable, "-m", "kvdoctor", "check", str(model), "--engine", "vllm", "--format", "json",
                          *args], capture_output=True, text=True, check=False)
    return [f["code"] for f in json.loads(run.stdout)["results"][0]["findings"]]


def test_check_reports_its_admission_refusal_and_no_false_layer_findings(tmp_path):
    """Several caches per layer: no window difference (VLM020) read off the wrong cache, no shared-storage warning
    (VLM031) from a probe built for one cache per layer; with HMA off in 40 GiB, vLLM's admission refusal."""
    model = tmp_path / "flash"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(POINTS[("Flash", "default")]["config"]))
    assert sorted(check_codes(model)) == ["CKPT008", "VLM023"]
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("vllm:\n  disable_hybrid_kv_cache_manager: true\n  kv_budget: 40GiB\n")
    assert "MEM004" in check_codes(model, "--deploy", str(deploy))


def budget_json(model: Path, *args: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "kvdoctor", "budget", str(model), "--format", "json", *args],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("model", ["Flash", "Pro"])
def test_budget_prices_it_through_the_plan_check_uses(tmp_path, model):
    """`kvdoctor budget` prices DeepSeek-V4 at vLLM with the caches and admission check the plan uses: on the CPU
    box's scheduler the refusal is vLLM's own text (goldens/vllm_check-0.34.0.json); with the CUDA one it fits."""
    point = POINTS[(model, "default")]
    path = tmp_path / model
    path.mkdir()
    (path / "config.json").write_text(json.dumps(point["config"]))
    deploy = tmp_path / "cpu.yaml"
    deploy.write_text(f"vllm:\n  max_num_batched_tokens: {point['fields']['max_num_batched_tokens']}\n"
                      "  async_scheduling: false\n")
    refused = budget_json(path, "--engine", "vllm", "--kv-budget", "40GiB", "--deploy", str(deploy))["engines"]
    assert refused[0]["error"]["message"] == point["outcome"]["message"]
    fits = budget_json(path, "--engine", "vllm", "--kv-budget", "40GiB")["engines"][0]
    assert "error" not in fits and fits["capacity"]["max_concurrency"] > 1
    assert len(fits["groups"]) == 5 and fits["pool"]["bytes_per_block"] == dsv4.size(
        point["config"], True, fits["mode"]["max_model_len"], fits["mode"]["in_flight_tokens"]).bytes_per_block
