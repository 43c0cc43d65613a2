"""Weights per rank from real configs and sparse checkpoints of their real tensor shapes: each figure is
rebuilt here from the config's own dimensions, split the way the engine's layer classes split them."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_model, real_config

from kvdoctor.engines.budget.weights import pp_partition, weights_per_rank
from kvdoctor.engines.sglang import weights as sglang_weights
from kvdoctor.engines.vllm import weights as vllm_weights
from kvdoctor.errors import InputError
from kvdoctor.load.loader import load_model


def _llama_rank_bytes(cfg: dict, tp: int, vocab_rows: int) -> int:
    """Llama's tensors as synth writes them (bf16), on one rank at TP `tp`."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // heads
    kv_rank = max(1, kv // tp)
    per_layer = (heads * hd * h // tp + 2 * kv_rank * hd * h + h * heads * hd // tp + 3 * inter * h // tp + h) * 2
    embed = 2 * vocab_rows * h * 2  # embed_tokens and lm_head, untied
    return layers * per_layer + embed + 2 * h


@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_llama_column_row_and_kv_replication(tmp_path: Path, tp: int) -> None:
    spec = load_model(str(make_model(tmp_path, "llama-3.1-8b")))
    cfg = real_config("llama-3.1-8b")
    w = weights_per_rank(spec.checkpoint, spec.config, vllm_weights.RULES, vllm_weights.parallel(tp), 32)
    vocab_rows = -(-cfg["vocab_size"] // 64) * 64 // tp
    assert w.bytes_per_rank == _llama_rank_bytes(cfg, tp, vocab_rows)
    assert w.unmatched == []
    if tp == 16:  # 8 KV heads on 16 ranks: each rank keeps one whole head, not half of one
        assert w.by_kind["kv_column"] == 32 * 2 * 128 * cfg["hidden_size"] * 2


def test_vocab_padding_is_priced(tmp_path: Path) -> None:
    cfg = {**real_config("llama-3.1-8b"), "vocab_size": 32001, "num_hidden_layers": 2}
    spec = load_model(str(make_model(tmp_path, cfg)))
    w1 = weights_per_rank(spec.checkpoint, spec.config, vllm_weights.RULES, vllm_weights.parallel(1), 2)
    w4 = weights_per_rank(spec.checkpoint, spec.config, vllm_weights.RULES, vllm_weights.parallel(4), 2)
    h = cfg["hidden_size"]
    per_row = 2 * h * 2  # embedding and head, bf16
    assert w1.by_kind["vocab"] == per_row * 32064  # padded to a multiple of 64 even on one rank
    assert w4.by_kind["vocab"] == per_row * 32064 // 4


def test_pipeline_stages_follow_vllm_partition(tmp_path: Path) -> None:
    assert pp_partition(32, 3) == [(0, 11), (11, 22), (22, 32)]
    assert pp_partition(30, 4) == [(0, 7), (7, 15), (15, 23), (23, 30)]
    with pytest.raises(InputError):
        pp_partition(2, 4)
    spec = load_model(str(make_model(tmp_path, "llama-3.1-8b")))
    w = weights_per_rank(spec.checkpoint, spec.config, vllm_weights.RULES, vllm_weights.parallel(1, pp=2), 32)
    cfg = real_config("llama-3.1-8b")
    vocab_bytes = cfg["vocab_size"] * cfg["hidden_size"] * 2
    # both stages hold 16 layers; the first adds the embedding, the last the head and the final norm
    assert w.per_stage[1] - w.per_stage[0] == 2 * cfg["hidden_size"]
    assert w.per_stage[0] + w.per_stage[1] == w.checkpoint_bytes
    assert w.per_stage[0] - vocab_bytes == w.per_stage[1] - vocab_bytes - 2 * cfg["hidden_size"]


def test_experts_over_ep_group_versus_tp(tmp_path: Path) -> None:
    spec = load_model(str(make_model(tmp_path, "gpt-oss-20b")))
    cfg = spec.config
    experts = cfg["num_local_experts"]
    plain = weights_per_rank(spec.checkpoint, cfg, vllm_weights.RULES, vllm_weights.parallel(1), cfg["num_hidden_layers"])
    ep3 = weights_per_rank(spec.checkpoint, cfg, vllm_weights.RULES, vllm_weights.parallel(3, expert_parallel=True),
                           cfg["num_hidden_layers"])
    tp4 = weights_per_rank(spec.checkpoint, cfg, vllm_weights.RULES, vllm_weights.parallel(4), cfg["num_hidden_layers"])
    total = plain.by_kind["expert"]
    assert ep3.by_kind["expert"] == pytest.approx(total * -(-experts // 3) / experts, rel=1e-6)  # fullest rank
    assert tp4.by_kind["expert"] == pytest.approx(total / 4, rel=1e-6)


def test_sglang_attention_dp_splits_attention_over_fewer_ranks(tmp_path: Path) -> None:
    spec = load_model(str(make_model(tmp_path, "qwen2.5-7b")))
    cfg, layers = spec.config, spec.num_hidden_layers
    plain = weights_per_rank(spec.checkpoint, cfg, sglang_weights.RULES, sglang_weights.parallel(4), layers)
    dpa = weights_per_rank(spec.checkpoint, cfg, sglang_weights.RULES, sglang_weights.parallel(4, dp=2, dp_attention=True),
                           layers)
    assert dpa.by_kind["row"] > plain.by_kind["row"]  # o_proj over 2 ranks, down_proj still over 4
    assert dpa.by_kind["vocab"] == plain.by_kind["vocab"]
    with pytest.raises(InputError, match="must divide"):
        sglang_weights.parallel(4, dp=3, dp_attention=True)


def test_quantized_tensors_are_priced_as_stored(tmp_path: Path) -> None:
    def fp8(layout: dict) -> None:
        for name, (_dtype, shape) in list(layout.items()):
            if name.endswith("proj.weight"):
                layout[name] = ("F8_E4M3", shape)
                layout[name[:-len("weight")] + "weight_scale"] = ("F32", [1])
    spec = load_model(str(make_model(tmp_path, "llama-3.1-8b", tensors=fp8)))
    w = weights_per_rank(spec.checkpoint, spec.config, vllm_weights.RULES, vllm_weights.parallel(1), 32)
    cfg = real_config("llama-3.1-8b")
    bf16 = _llama_rank_bytes(cfg, 1, cfg["vocab_size"])
    projections = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * cfg["intermediate_size"] * 4096)
    assert w.bytes_per_rank == bf16 - projections + 32 * 7 * 4  # one byte an element, plus the scales
