"""`check --engine mlx-lm`: the plan held to mlx-lm 0.32.2's own answers (goldens/mlx_check.json, written by
goldens/mlx_check_oracle.py with mlx-lm's make_prompt_cache, maybe_quantize_kv_cache, _merge_caches and
can_trim_prompt_cache over every real config and setting), and the command line on real fixtures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, check_json, make_model
from kvdoctor.engines.mlx_lm.plan import LayerCache, layer_caches, load_refusal, module_of, plan_from, refusals
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.engines.sglang_mlx.mlxlm import make_cache_module
from kvdoctor.load.loader import load_model

GOLDENS = json.loads((ROOT / "goldens" / "mlx_check.json").read_text())


def _config_path(name: str) -> Path:
    kind, _, stem = name.partition("/")
    return ROOT / "fixtures" / "configs" / "real" / f"{stem}.json" if kind == "real" else \
        ROOT / "fixtures" / "models" / stem / "config.json"


def _golden_row(cache: LayerCache) -> dict[str, Any]:
    """The plan's JSON row in the goldens' spelling (`class` for `mlx_class`)."""
    return {("class" if key == "mlx_class" else key): value for key, value in cache.json().items()}


def _same_error(refusal: Any, golden: dict[str, Any]) -> bool:
    if golden["outcome"] == "ok":
        return refusal is None
    return refusal is not None and (refusal.error_class, refusal.message) == (golden["class"], golden["message"])


def score(point: dict[str, Any], spec: Any, load: Any) -> tuple[int, int, list[str]]:
    """(agreeing, compared, what disagreed) over one golden point: the load outcome, each layer's class,
    max_size, keep and chunk, the cache count, the quantization outcome and the classes after it, the batch
    merge outcome and whether the caches can be trimmed. The parts `plan_from` joins, with the load
    refusal (which builds the class once) computed once per model."""
    result, settings = point["result"], MlxLmSettings(**point["settings"])
    if (load is None) != (result["outcome"] == "ok"):
        return 0, 1 + len(spec.layers), [f"load: plan {load}, mlx-lm {result['outcome']}"]
    if load is not None:
        ok = (load.error_class, load.message) == (result["class"], result["message"])
        return int(ok), 1, [] if ok else [f"load error: {load.message!r} vs {result['message']!r}"]
    module = module_of(spec)
    caches = layer_caches(spec, module, make_cache_module(module), settings.max_kv_size)
    built = [c for c in caches if c.cls is not None]
    checks: list[tuple[str, bool]] = [(f"layer {i}", i < len(built) and _golden_row(built[i]) == golden)
                                      for i, golden in enumerate(result["layers"])]
    checks.append(("cache count", len(built) == len(result["layers"])))
    codes = {r.code: r for r in refusals(caches, settings)}
    if "quantize" in result:
        checks.append(("quantize", _same_error(codes.get("MEM011"), result["quantize"])))
        if "quantized_layers" in result:
            after = ["QuantizedKVCache" if c.quantized else c.cls for c in built]
            checks.append(("quantized classes", after == result["quantized_layers"]))
    batched = refusals(caches, MlxLmSettings(**{**point["settings"], "kv_bits": None}, batch_generate=True))
    merge = result["merge"]
    checks.append(("merge", _same_error({r.code: r for r in batched}.get("MLX102"),
                                        merge if merge["outcome"] == "error" else {"outcome": "ok"})))
    checks.append(("trimmable", all(c.trimmable for c in built) == result["trimmable"]))
    return sum(ok for _, ok in checks), len(checks), [what for what, ok in checks if not ok]


def test_plan_agrees_with_mlx_lm_on_99_percent_of_golden_points(tmp_path):
    assert GOLDENS["versions"]["mlx-lm"] == "0.32.2"
    specs: dict[str, Any] = {}
    agree = total = 0
    missed: list[str] = []
    for point in GOLDENS["points"]:
        name = point["model"]
        if name not in specs:
            folder = tmp_path / name.replace("/", "__")
            folder.mkdir()
            (folder / "config.json").write_bytes(_config_path(name).read_bytes())
            spec = load_model(str(folder), with_checkpoint=False)
            specs[name] = (spec, load_refusal(spec, module_of(spec)))
        ok, n, what = score(point, *specs[name])
        agree, total = agree + ok, total + n
        missed += [f"{name} {point['settings']}: {w}" for w in what]
    assert total > 20000  # every real config's layers under four settings
    assert agree / total >= 0.99, missed[:20]
    print(f"mlx-lm goldens: {agree}/{total} points agree ({agree / total:.2%})")


def test_goldens_hold_each_failure_the_plan_predicts():
    """The oracle saw each error the plan words, with the plan's exact text, on a real model."""
    seen = {(r[k]["class"], r[k]["message"]) for p in GOLDENS["points"] for r in [p["result"]]
            for k in ("quantize", "merge") if r.get(k, {}).get("outcome") == "error"}
    assert ("NotImplementedError", "RotatingKVCache Quantization NYI") in seen
    assert ("ValueError", "<class 'mlx_lm.models.cache.ChunkedKVCache'> does not yet support batching with "
                          "history") in seen


def test_check_json_names_each_layers_mlx_lm_class(tmp_path):
    model = make_model(tmp_path, "gemma-3-1b-it")
    code, doc = check_json(str(model), "--engine", "mlx-lm", "--static")
    assert code == 0
    layers = doc["results"][0]["layers"]
    assert [row["mlx_class"] for row in layers[:6]] == ["RotatingKVCache"] * 5 + ["KVCache"]
    assert layers[0]["max_size"] == 512 and layers[0]["keep"] == 0 and "max_size" not in layers[5]
    assert doc["results"][0]["info"]["mlx_lm"]["classes"] == {"RotatingKVCache": 22, "KVCache": 4}


def test_check_predicts_the_rotating_quantization_error_from_the_deploy_file(tmp_path):
    model = make_model(tmp_path, "gpt-oss-20b")
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("mlx_lm:\n  kv_bits: 4\n")
    code, doc = check_json(str(model), "--engine", "mlx-lm", "--static", "--deploy", str(deploy))
    found = [f for f in doc["results"][0]["findings"] if f["code"] == "MEM011"]
    assert code == 1 and len(found) == 1
    assert found[0]["engine_error"] == {"class": "NotImplementedError", "stage": "prefill",
                                        "message": "RotatingKVCache Quantization NYI"}


@pytest.mark.parametrize("value", ["yes", 0])
def test_bad_mlx_lm_settings_are_one_line_errors(tmp_path, value):
    model = make_model(tmp_path, "llama-3.1-8b")
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(f"mlx_lm:\n  kv_bits: {value}\n")
    code, doc = check_json(str(model), "--engine", "mlx-lm", "--static", "--deploy", str(deploy))
    assert code == 2


def _probe(tmp_path: Path, name: str, deploy: str) -> tuple[int, dict[str, Any]]:
    model = make_model(tmp_path, name) if "/" not in name else _real(tmp_path, name)
    path = tmp_path / "deploy.yaml"
    path.write_text(deploy)
    code, doc = check_json(str(model), "--engine", "mlx-lm", "--deploy", str(path))
    return code, doc["results"][0]


def _real(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(_config_path(name).read_bytes())
    return folder


def test_probe_drives_gemmas_rotating_cache_past_its_window_and_through_quantization(tmp_path):
    code, result = _probe(tmp_path, "gemma-3-1b-it", "mlx_lm:\n  kv_bits: 4\n")
    rotating, full = result["info"]["mlx_lm"]["probe"]
    assert rotating["mlx_class"] == "RotatingKVCache" and len(rotating["layers"]) == 22 and full["mlx_class"] == "KVCache"
    assert rotating["shape"] == [1, 256, 256] and rotating["dtype"] == "bfloat16"
    assert rotating["window"]["detail"]["held"] == "5-516" == rotating["window"]["detail"]["expected"]
    assert rotating["quantize"] == {"outcome": "error", "class": "NotImplementedError",
                                    "message": "RotatingKVCache Quantization NYI"}
    assert rotating["trim"]["detail"] == {"before_wrap": True, "trimmed": 2, "after_wrap": False}
    assert rotating["merge"] == {"outcome": "ok", "detail": ["BatchRotatingKVCache"]}
    assert full["quantize"] == {"outcome": "ok", "detail": "QuantizedKVCache"}
    assert [f["code"] for f in result["findings"] if f["code"].startswith(("MEM", "MLX"))] == ["MEM011"]


def test_probe_merges_a_recurrent_state_and_cannot_merge_a_chunked_cache(tmp_path):
    _, result = _probe(tmp_path, "real/meta-llama__Llama-4-Scout-17B-16E-Instruct", "mlx_lm: {}\n")
    chunked = next(g for g in result["info"]["mlx_lm"]["probe"] if g["mlx_class"] == "ChunkedKVCache")
    assert chunked["merge"] == {"outcome": "error", "class": "ValueError", "message":
                                "<class 'mlx_lm.models.cache.ChunkedKVCache'> does not yet support batching with history"}
    assert not [f for f in result["findings"] if f["code"] == "MLX131"]  # the plan knows it
    _, result = _probe(tmp_path / "next", "qwen3-next", "mlx_lm:\n  kv_bits: 4\n")
    state = next(g for g in result["info"]["mlx_lm"]["probe"] if g["mlx_class"] == "ArraysCache")
    assert state["trim"]["detail"]["before_wrap"] is False and state["merge"]["outcome"] == "ok"
    assert "quantize" in state and state["quantize"]["detail"] == "ArraysCache"  # kept, not converted


@pytest.mark.parametrize("group, fires", [(64, True), (32, False)])
def test_a_head_size_the_kv_group_size_does_not_divide_is_predicted_and_the_probe_agrees(tmp_path, group, fires):
    _, result = _probe(tmp_path, "phi3-mini", f"mlx_lm:\n  kv_bits: 4\n  kv_group_size: {group}\n")
    codes = [f["code"] for f in result["findings"] if f["code"].startswith("MLX")]
    assert codes == (["MLX133"] if fires else [])  # the probe raised as predicted: no MLX131
    probe = result["info"]["mlx_lm"]["probe"][0]
    assert probe["quantize"]["outcome"] == ("error" if fires else "ok")


def test_the_predicted_group_size_error_is_mlx_lms_own_text_at_the_threshold(tmp_path):
    """A real KVCache of Phi-3's shape fed as generate_step feeds a 5001-token prompt (2048, 2048, 905),
    then mlx-lm's own maybe_quantize_kv_cache: the text the plan predicts, shape included."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import KVCache

    spec = load_model(str(make_model(tmp_path, "phi3-mini")), with_checkpoint=False)
    settings = MlxLmSettings(kv_bits=4)
    [predicted] = [r for r in plan_from(spec, settings).refusals if r.code == "MLX133"]
    cache = KVCache()
    for n in (2048, 2048, 905):
        cache.update_and_fetch(mx.zeros((1, 32, n, 96), dtype=mx.bfloat16), mx.zeros((1, 32, n, 96), dtype=mx.bfloat16))
    with pytest.raises(ValueError) as raised:
        maybe_quantize_kv_cache([cache], settings.quantized_kv_start, settings.kv_group_size, settings.kv_bits)
    assert str(raised.value) == predicted.message


def test_the_shipped_make_cache_list_is_the_installed_classes():
    """tools/mlx_lm_models.py reads which Model classes build their own caches from the wheel's source
    (inherited ones included); the installed classes themselves say the same."""
    from kvdoctor.engines.sglang_mlx.mlxlm import import_model_module, shipped_models

    def load(name: str) -> Any:
        try:
            return import_model_module(name)
        except (Exception, SystemExit):  # a module whose own extra dependency is absent (olmo exits)
            return None

    imported = {name: load(name) for name in shipped_models()["modules"]}
    real = {name for name, module in imported.items()
            if module is not None and hasattr(getattr(module, "Model", None), "make_cache")}
    assert sum(module is not None for module in imported.values()) > 120
    assert set(shipped_models()["make_cache"]) == real


def test_notes_say_what_mlx_lm_does_silently(tmp_path):
    qwen = load_model(str(make_model(tmp_path / "q", "qwen2.5-7b")), with_checkpoint=False)
    gemma = load_model(str(make_model(tmp_path / "g", "gemma-3-1b-it")), with_checkpoint=False)
    nxt = load_model(str(make_model(tmp_path / "n", "qwen3-next")), with_checkpoint=False)
    assert "keeps the first 4 tokens and the latest 4092" in plan_from(qwen, MlxLmSettings(max_kv_size=4096)).notes[0]
    assert plan_from(gemma, MlxLmSettings(max_kv_size=4096)).notes[0].startswith("mlx-lm ignores max_kv_size")
    notes = plan_from(nxt, MlxLmSettings(kv_bits=4)).notes
    assert any(n.startswith("--kv-bits 4 converts 12 of 48 caches to QuantizedKVCache") for n in notes)
    assert any("36 recurrent-state caches cannot be trimmed" in n for n in notes)


def _real_configs() -> list[Path]:
    root = Path(__file__).resolve().parent.parent / "fixtures"
    return sorted((root / "configs" / "real").glob("*.json")) + sorted((root / "models").glob("*/config.json"))


def test_the_shipped_model_args_fields_predict_the_real_classes_load_errors():
    """Without mlx-lm, the fields each ModelArgs cannot do without (tools/mlx_lm_models.py) predict the
    TypeError mlx-lm's own class raises on every real config, word for word, and on nothing else; and on
    the same configs with each required field of the wrapped text model dropped in turn."""
    from kvdoctor.engines.sglang_mlx.mlxlm import (ModuleExit, build_skeleton, module_name_for, shipped_args_error,
                                                   shipped_models)

    def cases():
        for path in _real_configs():
            config = json.loads(path.read_text())
            yield path.stem, config
            text = config.get("text_config")
            entry = shipped_models()["model_args"].get(module_name_for(config), {})
            for name in entry.get("text_args", {}).get("required", [])[:3] if isinstance(text, dict) else []:
                if name in text:
                    yield f"{path.stem}-{name}", {**config, "text_config": {k: v for k, v in text.items() if k != name}}

    predicted_errors = 0
    for name, config in cases():
        try:
            real = build_skeleton(config)
        except ModuleExit:
            continue
        if real.missing_module or real.unreadable:
            continue
        predicted = shipped_args_error(module_name_for(config), config)
        if predicted is not None:
            predicted_errors += 1
            assert (real.error_class, real.error_message) == ("TypeError", predicted), name
        else:
            assert not (real.error_class == "TypeError" and "required positional" in (real.error_message or "")), name
    assert predicted_errors >= 4  # the Qwen3-VL configs without tie_word_embeddings in their text_config


def test_an_mlx_lm_module_that_exits_at_import_is_a_note_not_an_exit(tmp_path):
    """mlx-lm's olmo module ends the process when ai2-olmo is absent: kvdoctor says so and goes on."""
    model = tmp_path / "olmo"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "olmo", "architectures": ["OLMoForCausalLM"], "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 128,
        "max_position_embeddings": 2048, "torch_dtype": "float32"}))
    for engine in ("sglang-mlx", "mlx-lm"):
        proc = subprocess.run([sys.executable, "-m", "kvdoctor", "check", str(model), "--engine", engine, "--static",
                               "--format", "json"], capture_output=True, text=True)
        assert proc.returncode == 0, (engine, proc.stdout[-500:], proc.stderr[-500:])
        document = json.loads(proc.stdout)
        assert document["summary"]["errors"] == 0
