"""`check --engine mlx-lm --dry-run`: mlx-lm's own model class on a weightless shrunk copy, through its own
generate_step / speculative_generate_step, prompt-cache trim and BatchGenerator, in a child process on CPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import ROOT, check_json, make_model
from kvdoctor.engines.mlx_lm.dryrun import differences_from
from kvdoctor.engines.mlx_lm.plan import plan_from
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.load.loader import load_model


def _dry_run(tmp_path: Path, model: Path, deploy: str) -> dict[str, Any]:
    path = tmp_path / "deploy.yaml"
    path.write_text(deploy)
    code, doc = check_json(str(model), "--engine", "mlx-lm", "--dry-run", "--deploy", str(path))
    assert code in (0, 1), doc
    return doc["results"][0]


def test_gemma_with_kv_bits_raises_the_predicted_error_in_mlx_lms_own_frame(tmp_path):
    result = _dry_run(tmp_path, make_model(tmp_path, "gemma-3-1b-it"), "mlx_lm:\n  kv_bits: 4\n")
    record = result["info"]["dry_run"]
    assert record["outcome"] == "error" and record["versions"] == {"mlx-lm": "0.32.2"}
    assert record["error"]["class"] == "NotImplementedError"
    assert record["error"]["message"] == "RotatingKVCache Quantization NYI"
    assert record["error"]["frame"] == "mlx_lm/models/cache.py:554 (in to_quantized)"
    assert record["stages"]["caches"] == "ok" and record["stages"]["generate"] == "error"
    assert record["differences"] == [] and record["prompt_tokens"] == 512 + 8
    assert record["layers"][0] == {"mlx_class": "RotatingKVCache", "max_size": 512, "keep": 0}
    assert [f["code"] for f in result["findings"] if f["code"] != "CKPT008"] == ["MEM011"]  # not twice


def test_llama_goes_through_generate_prompt_cache_and_batch_cleanly(tmp_path):
    result = _dry_run(tmp_path, make_model(tmp_path, "llama-3.1-8b"), "mlx_lm: {}\n")
    record = result["info"]["dry_run"]
    assert record["outcome"] == "clean" and record["differences"] == []
    assert all(status == "ok" for status in record["stages"].values())
    assert record["prompt_cache"] == {"trimmable": True, "trimmed": 2}
    assert record["batch"] == {"requests": 2, "finished": 2}
    assert [f["code"] for f in result["findings"] if f["code"] != "CKPT008"] == []


def test_llama4_in_a_batch_generator_meets_the_chunked_cache_merge(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    source = ROOT / "fixtures" / "configs" / "real" / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json"
    (folder / "config.json").write_bytes(source.read_bytes())
    result = _dry_run(tmp_path, folder, "mlx_lm:\n  batch_generate: true\n")
    record = result["info"]["dry_run"]
    assert record["error"]["message"] == ("<class 'mlx_lm.models.cache.ChunkedKVCache'> does not yet support "
                                          "batching with history")
    assert record["stages"]["batch"] == "error" and record["stages"]["prompt_cache"] == "ok"
    assert [f["code"] for f in result["findings"] if f["code"] != "CKPT008"] == ["MLX102"]


def test_a_plan_for_other_settings_differs_from_what_mlx_lm_built(tmp_path):
    model = make_model(tmp_path, "qwen2.5-7b")
    result = _dry_run(tmp_path, model, "mlx_lm: {}\n")
    built = result["info"]["dry_run"]["layers"]
    assert {row["mlx_class"] for row in built} == {"KVCache"}
    other = plan_from(load_model(str(model), with_checkpoint=False), MlxLmSettings(max_kv_size=4096))
    differences = differences_from(other, [dict(row) for row in built])
    assert len(differences) == 28
    assert differences[0] == ("cache 0 (layer 0): plan {'mlx_class': 'RotatingKVCache', 'max_size': 4096, 'keep': 4}, "
                              "mlx-lm {'mlx_class': 'KVCache'}")
