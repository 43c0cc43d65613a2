"""Issue 43's impossible checkpoints, each against a healthy twin: q_proj rows or hidden columns that disagree with
the config (CKPT001 with the config's line) and an index whose weight map is empty (one input-error line naming the
index's line, exit 2). Real safetensors files, the real command line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from helpers import run

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512,
          "vocab_size": 1000, "torch_dtype": "float16"}
SHARD = "model-00001-of-00001.safetensors"


def _model(folder: Path, q_shape=(256, 256), weight_map=None) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=1))
    tensors = {"model.embed_tokens.weight": np.zeros((1000, 256), np.float16),
               "lm_head.weight": np.zeros((1000, 256), np.float16)}
    for i in range(2):
        tensors |= {f"model.layers.{i}.self_attn.q_proj.weight": np.zeros(q_shape, np.float16),
                    f"model.layers.{i}.self_attn.k_proj.weight": np.zeros((64, 256), np.float16),
                    f"model.layers.{i}.self_attn.v_proj.weight": np.zeros((64, 256), np.float16),
                    f"model.layers.{i}.self_attn.o_proj.weight": np.zeros((256, 256), np.float16)}
    if weight_map is None:
        save_file(tensors, str(folder / "model.safetensors"))
    else:
        save_file(tensors, str(folder / SHARD))
        index = {"metadata": {"total_size": 1}, "weight_map": weight_map(tensors)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return folder


@pytest.mark.parametrize("q_shape, line", [((384, 256), 8), ((256, 300), 7)], ids=["q-proj-rows", "hidden-columns"])
def test_a_projection_that_disagrees_with_the_config_is_an_error_with_its_line(tmp_path, q_shape, line):
    bad = _model(tmp_path / "bad", q_shape=q_shape)
    proc = run("check", "--static", "--format", "json", str(bad))
    assert proc.returncode == 1
    findings = json.loads(proc.stdout)["results"][0]["findings"]
    assert {(f["code"], f["file"], f["line"]) for f in findings if f["severity"] == "error"} == {("CKPT001", "config.json", line)}
    assert run("check", "--static", str(_model(tmp_path / "twin"))).returncode == 0


def test_an_index_with_an_empty_weight_map_is_one_line_with_its_line(tmp_path):
    bad = _model(tmp_path / "bad", weight_map=lambda tensors: {})
    proc = run("check", "--static", str(bad))
    assert proc.returncode == 2
    assert f"{bad}/model.safetensors.index.json:5: weight_map is empty" in proc.stderr
    assert "Traceback" not in proc.stderr
    twin = _model(tmp_path / "twin", weight_map=lambda tensors: {name: SHARD for name in tensors})
    assert run("check", "--static", str(twin)).returncode == 0
