"""`kvdoctor check --engine vllm` end to end, and the one `vllm:` section that check and budget share."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import run

from kvdoctor.engines.budget.facts import facts_from_spec
from kvdoctor.engines.budget.run import plan_engine
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.engines.deploy import deploy_from
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "fixtures" / "models"
REAL = sorted((ROOT / "fixtures" / "configs" / "real").glob("*.json"))


def _dirs(tmp_path: Path) -> list[Path]:
    out = sorted(p for p in MODELS.iterdir() if p.is_dir())
    for config in REAL:
        target = tmp_path / config.stem
        target.mkdir()
        shutil.copy(config, target / "config.json")
        out.append(target)
    return out


# The real configs vLLM 0.33.0 refuses as published, with its default settings (goldens/vllm_check.json):
# a model type transformers 5.20.2 lacks, an architecture its registry lacks, a config class that is
# the checkpoint's own code (trust_remote_code).
REFUSED_AS_PUBLISHED = {"MiniMaxAI__MiniMax-M3": "VLM138", "XiaomiMiMo__MiMo-7B-Base": "VLM138",
                        "stepfun-ai__Step-3.7-Flash": "VLM139",
                        "nvidia__Llama-3_3-Nemotron-Super-49B-v1": "VLM143"}


def test_every_real_config_checks_without_error_findings(tmp_path):
    catalog = builtin_catalog()
    planned = 0
    refused = {}
    for target in _dirs(tmp_path):
        result = check_target(str(target), Options(catalog=catalog, engine="vllm", static=True))
        assert result.error is None, (target.name, result.error)
        errors = [f for f in result.findings if f.severity == "error"]
        vllm = result.info["vllm"]
        if errors:  # only vLLM's own start-up refusal, and then nothing planned
            (error,) = errors
            assert error.engine_error and not vllm["groups"], target.name
            refused[target.name] = error.code
            continue
        if vllm["modeled"]:
            planned += 1
            grouped = sorted(i for g in vllm["groups"] for i in g["layer_ids"])
            # every layer with a spec is grouped, and only those; a layer sits in one group, except DeepSeek-V4's,
            # which carry several caches each (tests/test_vllm_dsv4.py holds their groups to vLLM's)
            assert grouped and set(grouped) == {row["index"] for row in result.layers if row.get("engine_spec")}
            if len(grouped) != len(set(grouped)):
                assert vllm["architecture"] == "DeepseekV4ForCausalLM", target.name
        else:
            assert "VLM024" in [f.code for f in result.findings]
    assert planned >= 40  # the unmodeled ones are the few hybrid / NAS classes outside the table
    assert refused == REFUSED_AS_PUBLISHED


def test_cli_json_has_info_vllm_and_per_layer_fields():
    proc = run("check", str(MODELS / "google__gemma-3-1b-it"), "--engine", "vllm", "--format", "json", "-q")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    result = doc["results"][0] if "results" in doc else doc
    info = result["info"]["vllm"]
    assert info["architecture"] == "Gemma3ForCausalLM" and info["hma"]["on"] is True
    assert {g["spec"] for g in info["groups"]} == {"SlidingWindowSpec", "FullAttentionSpec"}
    assert all(p["problems"] == [] for p in info["probe"])  # the paged-cache probe ran on every group
    row = result["layers"][0]
    assert row["engine_spec"] == "SlidingWindowSpec" and row["engine_window"] == 512
    assert row["num_kv_heads"] == 1 and row["head_size"] == 256 and row["page_size_bytes"] == 64 * 2 * 256 * 2  # 0.34.0: blocks of 64
    assert row["engine_dtype"] == "bfloat16"


def test_demo_refusal_is_caught_before_deploy_at_its_line():
    proc = run("check", str(MODELS / "openai__gpt-oss-20b"), "--engine", "vllm", "--format", "json", "-q",
               "--deploy", str(ROOT / "fixtures" / "demo" / "vllm-too-long.yaml"))
    doc = json.loads(proc.stdout)
    result = doc["results"][0] if "results" in doc else doc
    (finding,) = [f for f in result["findings"] if f["code"] == "VLM002"]
    assert finding["engine_error"]["message"].startswith("User-specified max_model_len (262144)")
    assert proc.returncode == 1


def test_fp8_kv_changes_the_engine_dtype():
    catalog = builtin_catalog()
    deploy = deploy_from({"vllm": {"kv_cache_dtype": "fp8"}})
    result = check_target(str(MODELS / "meta-llama__Llama-3.1-8B"),
                          Options(catalog=catalog, engine="vllm", static=True, deploy=deploy))
    assert {row["engine_dtype"] for row in result.layers} == {"uint8"}


def test_old_budget_names_are_read_with_a_warning_at_their_line():
    deploy = deploy_from({"vllm": {"hma": False, "tp": 2, "prefix_caching": False, "num_speculative_tokens": 2}},
                         "d.yaml", {"vllm.hma": 3, "vllm.tp": 4})
    s = deploy.settings("vllm")
    assert s.disable_hybrid_kv_cache_manager is True and s.tensor_parallel_size == 2  # type: ignore[attr-defined]
    assert s.enable_prefix_caching is False and s.num_speculative_tokens == 2  # type: ignore[attr-defined]
    assert any("vllm.tp -> vllm.tensor_parallel_size" in w for w in deploy.warnings)
    source = deploy.source("vllm.disable_hybrid_kv_cache_manager")
    assert (source.ref, source.line) == ("vllm.hma", 3)
    with pytest.raises(Exception, match="old spelling"):
        deploy_from({"vllm": {"tp": 2, "tensor_parallel_size": 2}}, "d.yaml")


def test_budget_reads_the_same_section():
    spec = load_model(str(MODELS / "openai__gpt-oss-20b"), library_check=False)
    facts = facts_from_spec(spec)
    for section, hma in (({"disable_hybrid_kv_cache_manager": True}, False), ({}, True), ({"hma": False}, False)):
        deploy = deploy_from({"budget": {"kv_budget": "40GiB", "context": 8192}, "vllm": {**section,
                                                                                         "tensor_parallel_size": 2}
                              if "hma" not in section else {**section, "tp": 2}})
        (budget,), _ = plan_engine("vllm", facts, spec.config, deploy.budget, deploy.settings("vllm"), all_modes=False)
        assert budget.mode.hma is hma and budget.mode.tp == 2


def test_dry_run_without_a_vllm_python_is_one_eng050_and_the_static_checks_still_run(tmp_path, monkeypatch):
    from kvdoctor.engines import child
    from kvdoctor.engines.vllm import dryrun

    monkeypatch.delenv(dryrun.ENV_PYTHON, raising=False)
    monkeypatch.setattr(child, "REPO", tmp_path)  # no goldens/.venv/vllm there
    deploy = deploy_from({"vllm": {"max_model_len": 262144}})
    result = check_target(str(MODELS / "meta-llama__Llama-3.1-8B"),
                          Options(catalog=builtin_catalog(), engine="vllm", deploy=deploy,
                                  extra={"dry_run": True, "engine_python": str(tmp_path / "missing")}))
    codes = [f.code for f in result.findings]
    assert codes.count("ENG050") == 1 and "VLM002" in codes


def test_select_mem004_alone_keeps_the_plans_admission_refusal(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("vllm:\n  kv_budget: 4GiB\n")
    codes = []
    for select in ((), ("--select", "MEM004")):
        proc = run("check", str(MODELS / "meta-llama__Llama-3.1-8B"), "--engine", "vllm", "--format", "json", "-q",
                   "--static", "--deploy", str(deploy), *select)
        doc = json.loads(proc.stdout)
        result = doc["results"][0] if "results" in doc else doc
        codes.append([f["code"] for f in result["findings"]])
    assert "MEM004" in codes[0]
    assert codes[1] == ["MEM004"]  # the same finding, and nothing but it


def test_vlm021_points_at_the_deploy_line_that_turned_hma_off(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("vllm:\n  max_model_len: 32768\n  disable_hybrid_kv_cache_manager: true\n")
    proc = run("check", str(MODELS / "google__gemma-3-1b-it"), "--engine", "vllm", "--format", "json", "-q",
               "--static", "--deploy", str(deploy))
    doc = json.loads(proc.stdout)
    result = doc["results"][0] if "results" in doc else doc
    (finding,) = [f for f in result["findings"] if f["code"] == "VLM021"]
    assert (Path(finding["file"]).name, finding["line"]) == ("deploy.yaml", 3)
