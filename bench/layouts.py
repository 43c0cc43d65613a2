"""Real-sized checkpoint layouts (tensor names, dtypes, shapes as published) for the benchmark.

Kimi-Linear-48B-A3B-Instruct: from its published config (fixtures/models), with the MoE tensor naming
of its modelling code (`block_sparse_moe.experts.{e}.w1/w2/w3`, a dense first layer).
gpt-oss-120b: its published architecture (36 layers, 128 experts, MXFP4 expert blocks as U8 with
per-block scales, attention sinks).
"""
from __future__ import annotations

import json
from pathlib import Path

from kvdoctor.load.synth import add_kda, add_mla

ROOT = Path(__file__).resolve().parent.parent
KIMI_CONFIG = ROOT / "fixtures" / "models" / "moonshotai__Kimi-Linear-48B-A3B-Instruct" / "config.json"

GPT_OSS_120B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 36,
    "num_local_experts": 128, "experts_per_token": 4, "num_experts_per_tok": 4, "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
    "vocab_size": 201088, "tie_word_embeddings": False, "max_position_embeddings": 131072,
    "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                           "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                                           "truncate": False},
    "layer_types": ["sliding_attention", "full_attention"] * 18, "torch_dtype": "bfloat16",
    "attention_bias": True, "swiglu_limit": 7.0,
}


def kimi_linear_48b() -> tuple[dict, dict]:
    cfg = json.loads(KIMI_CONFIG.read_text())
    hidden, vocab, bf = cfg["hidden_size"], cfg["vocab_size"], "BF16"
    kda = set(cfg["linear_attn_config"]["kda_layers"])
    out = {"model.embed_tokens.weight": (bf, [vocab, hidden]), "model.norm.weight": (bf, [hidden]),
           "lm_head.weight": (bf, [vocab, hidden])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (bf, [hidden])
        out[p + "post_attention_layernorm.weight"] = (bf, [hidden])
        (add_kda if i + 1 in kda else add_mla)(out, p, cfg, bf)
        if i < cfg["first_k_dense_replace"]:
            inter = cfg["intermediate_size"]
            for n, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]), ("down_proj", [hidden, inter])):
                out[f"{p}mlp.{n}.weight"] = (bf, shape)
            continue
        m = p + "block_sparse_moe."
        inter = cfg["moe_intermediate_size"]
        out[m + "gate.weight"] = (bf, [cfg["num_experts"], hidden])
        out[m + "gate.e_score_correction_bias"] = ("F32", [cfg["num_experts"]])
        for e in range(cfg["num_experts"]):
            out[f"{m}experts.{e}.w1.weight"] = (bf, [inter, hidden])
            out[f"{m}experts.{e}.w2.weight"] = (bf, [hidden, inter])
            out[f"{m}experts.{e}.w3.weight"] = (bf, [inter, hidden])
        shared = inter * cfg["num_shared_experts"]
        for n, shape in (("gate_proj", [shared, hidden]), ("up_proj", [shared, hidden]), ("down_proj", [hidden, shared])):
            out[f"{m}shared_experts.{n}.weight"] = (bf, shape)
    return cfg, out


def gpt_oss_120b() -> tuple[dict, dict]:
    cfg = dict(GPT_OSS_120B_CONFIG)
    hidden, vocab, bf = cfg["hidden_size"], cfg["vocab_size"], "BF16"
    e, inter, h, kv, hd = cfg["num_local_experts"], cfg["intermediate_size"], 64, 8, 64
    out = {"model.embed_tokens.weight": (bf, [vocab, hidden]), "model.norm.weight": (bf, [hidden]),
           "lm_head.weight": (bf, [vocab, hidden])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (bf, [hidden])
        out[p + "post_attention_layernorm.weight"] = (bf, [hidden])
        for n, rows in (("q_proj", h * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            out[f"{p}self_attn.{n}.weight"] = (bf, [rows, hidden])
            out[f"{p}self_attn.{n}.bias"] = (bf, [rows])
        out[p + "self_attn.o_proj.weight"] = (bf, [hidden, h * hd])
        out[p + "self_attn.o_proj.bias"] = (bf, [hidden])
        out[p + "self_attn.sinks"] = (bf, [h])
        out[p + "mlp.router.weight"] = (bf, [e, hidden])
        out[p + "mlp.router.bias"] = (bf, [e])
        out[p + "mlp.experts.gate_up_proj_blocks"] = ("U8", [e, 2 * inter, hidden // 32, 16])
        out[p + "mlp.experts.gate_up_proj_scales"] = ("U8", [e, 2 * inter, hidden // 32])
        out[p + "mlp.experts.gate_up_proj_bias"] = (bf, [e, 2 * inter])
        out[p + "mlp.experts.down_proj_blocks"] = ("U8", [e, hidden, inter // 32, 16])
        out[p + "mlp.experts.down_proj_scales"] = ("U8", [e, hidden, inter // 32])
        out[p + "mlp.experts.down_proj_bias"] = (bf, [e, hidden])
    return cfg, out


LAYOUTS = {"kimi-linear-48b": (kimi_linear_48b, 20), "gpt-oss-120b": (gpt_oss_120b, 15)}
