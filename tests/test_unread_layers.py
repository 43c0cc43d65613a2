"""Config forms the engines answer themselves (issue 42's held-out sets). A config no library class reads and with
no layer count (Phi-2's and Phi-1.5's `phi-msft` remote-code form): vLLM refuses it at its config stage and SGLang
in its config loader, before reading a layer, and so do their profiles; every other use of the layers is the loader's
one-line error, exit 2. A composite
config whose text_config leaves its sizes to its class (LLaVA-NeXT's): the class's defaults, as vLLM reads them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import run

ROOT = Path(__file__).resolve().parents[1]
PHI2 = ROOT / "goldens" / "heldout-rel" / "microsoft__phi-2.json"  # source: goldens/heldout-rel/SOURCES.md


@pytest.fixture
def phi2(tmp_path: Path) -> Path:
    d = tmp_path / "phi-2"
    d.mkdir()
    shutil.copy(PHI2, d / "config.json")
    return d


def check_json(*args: str) -> tuple[int, dict, str]:
    proc = run("check", "--static", "--format", "json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def vllm_refusal(release: str) -> dict:
    """What that release's own code answered for the unchanged config at its defaults (the oracle's point)."""
    doc = json.loads((PHI2.parent / f"vllm_check-{release}.json").read_text())
    [point] = [p for p in doc["points"] if p["model"] == "microsoft__phi-2" and p["setting"] == "default"]
    return point["outcome"]


@pytest.mark.parametrize("release", ["0.26.0", "0.34.0"])
def test_vllm_refuses_a_remote_code_config_at_the_config_stage(phi2, release):
    want = vllm_refusal(release)
    assert not want["start"] and want["stage"] == "config"
    rc, doc, _ = check_json(str(phi2), "--engine", f"vllm=={release}")
    result = doc["results"][0]
    assert rc == 1 and result.get("error") is None
    [refusal] = [f for f in result["findings"] if f["severity"] == "error"]
    assert refusal["code"] == "VLM143"
    assert refusal["engine_error"]["class"] == want["class"]
    # the same text, naming the directory each was given
    given = want["message"].split("The repository ", 1)[1].split(" ", 1)[0]
    assert refusal["message"] == want["message"].split("Value error, ", 1)[1].rsplit(" [type=", 1)[0].replace(
        given, str(phi2))


def test_an_unknown_model_type_without_layers_is_vllms_unrecognized_type(tmp_path):
    config = json.loads(PHI2.read_text())
    del config["auto_map"]  # no code named: transformers does not recognise the model type
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    rc, doc, _ = check_json(str(d), "--engine", "vllm")
    codes = [f["code"] for f in doc["results"][0]["findings"] if f["severity"] == "error"]
    assert rc == 1 and codes == ["VLM138"]


PHI15 = ROOT / "goldens" / "heldout-rel" / "sglang_microsoft__phi-1_5.json"  # source: goldens/heldout-rel/SOURCES.md


@pytest.mark.parametrize("golden", sorted(PHI15.parent.glob("sglang_check-*.json")), ids=lambda p: p.stem)
def test_sglang_refuses_a_remote_code_config_in_its_config_loader(tmp_path, golden):
    """Each release's own start-up (goldens/heldout-rel/sglang_check-<release>.json) against the profile at it."""
    doc = json.loads(golden.read_text())
    [point] = [p for p in doc["points"] if p["model"] == PHI15.stem and p["setting"] == "default"]
    want = point["result"]
    assert want["outcome"] == "refused" and want["refused_at"] == "server_args"
    d = tmp_path / "phi-1_5"
    d.mkdir()
    shutil.copy(PHI15, d / "config.json")
    rc, out, _ = check_json(str(d), "--engine", f"sglang=={doc['versions']['sglang']}")
    result = out["results"][0]
    assert rc == 1 and result.get("error") is None
    [refusal] = [f for f in result["findings"] if f["severity"] == "error"]
    assert refusal["code"] == "SGL150" and refusal["engine_error"]["class"] == want["error"]["class"]
    given = want["error"]["message"].split("The repository ", 1)[1].split(" ", 1)[0]
    assert refusal["message"] == want["error"]["message"].replace(given, str(d))


@pytest.mark.parametrize("args", [("check", "--static"), ("check", "--static", "--engine", "sglang-mlx"),
                                  ("budget", "--kv-budget", "4GiB"), ("budget", "--engine", "vllm", "--kv-budget",
                                                                      "4GiB"),
                                  ("budget", "--engine", "sglang", "--kv-budget", "4GiB")])
def test_whatever_needs_the_layers_is_one_line_and_exit_2(phi2, args):
    command, *rest = args
    proc = run(command, str(phi2), *rest)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "missing or invalid 'num_hidden_layers' (None)" in proc.stderr


def test_trusting_the_code_does_not_make_the_layers_readable(phi2, tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: vllm\nvllm:\n  trust_remote_code: true\n")
    proc = run("check", "--static", str(phi2), "--deploy", str(deploy))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "missing or invalid 'num_hidden_layers' (None)" in proc.stderr


LLAVA_NEXT = ROOT / "goldens" / "heldout-rel2" / "llava-hf__llava-v1.6-mistral-7b-hf.json"  # its SOURCES.md


def test_a_text_config_that_leaves_its_sizes_to_its_class_gets_the_class_defaults(tmp_path):
    """What vLLM 0.34.0 built for LLaVA-NeXT (goldens/heldout-rel2/vllm_check-0.34.0.json): the layers of
    MistralConfig's defaults, in the root config's float16."""
    from kvdoctor.engines.vllm.profile import plan
    from kvdoctor.engines.vllm.settings import VllmSettings
    from kvdoctor.load.loader import load_model

    d = tmp_path / "llava"
    d.mkdir()
    shutil.copy(LLAVA_NEXT, d / "config.json")
    spec = load_model(str(d), library_check=False)
    assert {"num_hidden_layers", "hidden_size", "num_attention_heads"} <= set(spec.defaults)
    doc = json.loads((LLAVA_NEXT.parent / "vllm_check-0.34.0.json").read_text())
    [point] = [p for p in doc["points"] if p["model"] == LLAVA_NEXT.stem and p["setting"] == "default"]
    assert point["outcome"]["start"]
    got = plan(spec, VllmSettings(kv_budget=point["kv_budget_bytes"]).at_release("0.34.0"))
    assert not got.refusals
    assert [(layer.extra["engine_spec"], layer.extra["num_kv_heads"], layer.extra["head_size"], layer.extra["dtype"])
            for layer in got.layers] == [(row["spec"], row["num_kv_heads"], row["head_size"], row["dtype"])
                                         for row in point["layers"]]


def test_a_top_level_config_without_a_layer_count_stays_bad_input(tmp_path):
    config = json.loads(LLAVA_NEXT.read_text())["text_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = run("check", "--static", str(tmp_path), "--engine", "vllm")
    assert proc.returncode == 2 and "missing or invalid 'num_hidden_layers' (None)" in proc.stderr
