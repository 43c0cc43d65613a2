"""Write held-out set 14 (issue 43): one plausible change each to real configs of the hard families.

    python3 tools/mutate_heldout.py [--check]

Each mutation is one edit a fine-tune, a pruned or quantized release or a user's local copy makes to a published
config: a window or a layer-type pattern, an attention or linear-attention head count, fewer layers with the layer
lists kept consistent, an MLA latent size, a quantization scheme, a VLM's text_config field. The list is fixed (no
draw), so the output is the same on every run; `--check` only verifies the committed files match it. Writes
fixtures/configs/fresh/v14_<base>__<mutation>.json and prints the SOURCES lines for SOURCES-vllm.md.
"""
from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "fixtures/configs/real"
FRESH = ROOT / "fixtures/configs/fresh"


def _text(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def _set(*pairs: object) -> Callable[[dict], None]:
    """Set dotted keys (`text_config.sliding_window`): path, value, path, value, ..."""
    def edit(cfg: dict) -> None:
        for path, value in zip(pairs[::2], pairs[1::2]):
            *parents, last = str(path).split(".")
            node = cfg
            for key in parents:
                node = node[key]
            node[last] = value
    return edit


def _truncate_layers(n: int) -> Callable[[dict], None]:
    """Keep the first n decoder layers, cutting the per-layer lists to match (a pruned derivative)."""
    def edit(cfg: dict) -> None:
        text = _text(cfg)
        text["num_hidden_layers"] = n
        for key in ("layer_types", "hybrid_layer_pattern", "moe_layer_freq"):
            if isinstance(text.get(key), list):
                text[key] = text[key][:n]
        if isinstance(text.get("hybrid_override_pattern"), str):
            text["hybrid_override_pattern"] = text["hybrid_override_pattern"][:n]
    return edit


def _layer_types_every(period: int) -> Callable[[dict], None]:
    """Every period-th layer full attention (1-based, as the published patterns), the rest as the config's other type."""
    def edit(cfg: dict) -> None:
        text = _text(cfg)
        other = next(t for t in text["layer_types"] if t != "full_attention")
        text["layer_types"] = ["full_attention" if (i + 1) % period == 0 else other
                               for i in range(text["num_hidden_layers"])]
    return edit


def _step_layer_types_every(period: int) -> Callable[[dict], None]:
    """Step-3.7's pattern starts with a full layer: full at 0, period, 2*period, ..."""
    def edit(cfg: dict) -> None:
        cfg["layer_types"] = ["full_attention" if i % period == 0 else "sliding_attention"
                              for i in range(cfg["num_hidden_layers"])]
    return edit


def _kimi_linear_full_every(period: int) -> Callable[[dict], None]:
    """Kimi-Linear lists its layers 1-based: full attention at every period-th and the last, KDA elsewhere."""
    def edit(cfg: dict) -> None:
        n = cfg["num_hidden_layers"]
        full = sorted({i for i in range(period, n + 1, period)} | {n})
        cfg["linear_attn_config"]["full_attn_layers"] = full
        cfg["linear_attn_config"]["kda_layers"] = [i for i in range(1, n + 1) if i not in full]
    return edit


def _mimo_window(size: int) -> Callable[[dict], None]:
    """MiMo-V2 states its window twice (`sliding_window`, `sliding_window_size`); a changed window changes both."""
    def edit(cfg: dict) -> None:
        cfg["sliding_window"] = size
        cfg["sliding_window_size"] = size
    return edit


def _add_quant(scheme: dict) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        cfg["quantization_config"] = scheme
    return edit


def _add_kv_scheme(cfg: dict) -> None:
    """llm-compressor's FP8 KV scheme, as a quantizer adds it to a compressed-tensors checkpoint."""
    cfg["quantization_config"]["kv_cache_scheme"] = {
        "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


# The AutoAWQ GEMM scheme as Qwen's own -AWQ releases state it.
AWQ_G128 = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq",
            "version": "gemm", "zero_point": True}

# (base file stem, mutation name, what it does, the edit)
MUTATIONS: list[tuple[str, str, str, Callable[[dict], None]]] = [
    ("Qwen__Qwen3-Next-80B-A3B-Instruct", "full_attention_interval_2",
     "`full_attention_interval` 4 -> 2 (a full-attention layer every second layer)", _set("full_attention_interval", 2)),
    ("Qwen__Qwen3.5-27B", "text_layers_48",
     "`text_config.num_hidden_layers` 64 -> 48, `layer_types` cut to the first 48", _truncate_layers(48)),
    ("Qwen__Qwen3.6-35B-A3B", "text_linear_value_heads_16",
     "`text_config.linear_num_value_heads` 32 -> 16 (one per key head)", _set("text_config.linear_num_value_heads", 16)),
    ("moonshotai__Kimi-Linear-48B-A3B-Instruct", "full_attn_every_3",
     "`linear_attn_config.full_attn_layers` every third layer and the last (1-based), `kda_layers` the rest",
     _kimi_linear_full_every(3)),
    ("nvidia__Nemotron-H-56B-Base-8K", "layers_60",
     "`num_hidden_layers` 118 -> 60, `hybrid_override_pattern` cut to its first 60 blocks", _truncate_layers(60)),
    ("nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "ssm_cache_bf16",
     "`mamba_ssm_cache_dtype` float32 -> bfloat16", _set("mamba_ssm_cache_dtype", "bfloat16")),
    ("tiiuae__Falcon-H1-0.5B", "max_position_32k",
     "`max_position_embeddings` 16384 -> 32768", _set("max_position_embeddings", 32768)),
    ("ai21labs__AI21-Jamba-1.5-Mini", "attn_period_4",
     "`attn_layer_period` 8 -> 4, `attn_layer_offset` 4 -> 2 (attention at layers 2, 6, 10, ...)",
     _set("attn_layer_period", 4, "attn_layer_offset", 2)),
    ("deepseek-ai__DeepSeek-V3", "layers_30",
     "`num_hidden_layers` 61 -> 30", _set("num_hidden_layers", 30)),
    ("deepseek-ai__DeepSeek-V2-Lite", "qk_rope_head_dim_32",
     "`qk_rope_head_dim` 64 -> 32", _set("qk_rope_head_dim", 32)),
    ("moonshotai__Kimi-K2-Instruct", "kv_lora_rank_256",
     "`kv_lora_rank` 512 -> 256", _set("kv_lora_rank", 256)),
    ("zai-org__GLM-5", "index_head_dim_64",
     "`index_head_dim` 128 -> 64", _set("index_head_dim", 64)),
    ("openai__gpt-oss-20b", "sliding_window_256",
     "`sliding_window` 128 -> 256", _set("sliding_window", 256)),
    ("google__gemma-3-27b-it", "text_sliding_window_512",
     "`text_config.sliding_window` 1024 -> 512", _set("text_config.sliding_window", 512)),
    ("google__gemma-3-1b-it", "sliding_window_pattern_4",
     "`sliding_window_pattern` 6 -> 4", _set("sliding_window_pattern", 4)),
    ("google__gemma-4-26B-A4B", "text_layer_types_every_4",
     "`text_config.layer_types`: full attention every fourth layer (was every sixth)", _layer_types_every(4)),
    ("XiaomiMiMo__MiMo-V2-Flash", "sliding_window_512",
     "`sliding_window` and `sliding_window_size` 128 -> 512", _mimo_window(512)),
    ("stepfun-ai__Step-3.7-Flash", "layer_types_every_3",
     "`layer_types`: full attention every third layer from layer 0 (was every fourth)", _step_layer_types_every(3)),
    ("meta-llama__Llama-4-Scout-17B-16E-Instruct", "text_chunk_4096",
     "`text_config.attention_chunk_size` 8192 -> 4096", _set("text_config.attention_chunk_size", 4096)),
    ("Qwen__Qwen3-30B-A3B-FP8", "weight_block_64",
     "`quantization_config.weight_block_size` [128, 128] -> [64, 64]", _set("quantization_config.weight_block_size", [64, 64])),
    ("Qwen__Qwen3-8B", "awq_g128",
     "an AutoAWQ 4-bit GEMM `quantization_config`, group size 128 (as Qwen's -AWQ releases)", _add_quant(AWQ_G128)),
    ("nvidia__Gemma-4-31B-IT-NVFP4", "fp8_kv_scheme",
     "`quantization_config.kv_cache_scheme`: FP8 per-tensor static (llm-compressor's)", _add_kv_scheme),
    ("Qwen__Qwen3-VL-8B-Instruct", "text_kv_heads_4",
     "`text_config.num_key_value_heads` 8 -> 4", _set("text_config.num_key_value_heads", 4)),
    ("mistralai__Devstral-Small-2-24B-Instruct", "text_sliding_window_4096",
     "`text_config.sliding_window` null -> 4096", _set("text_config.sliding_window", 4096)),
]


def _base(stem: str) -> Path:
    for folder in (REAL, FRESH):
        if (folder / f"{stem}.json").exists():
            return folder / f"{stem}.json"
    raise SystemExit(f"no base config {stem}")


def build() -> dict[Path, str]:
    out = {}
    for stem, name, _what, edit in MUTATIONS:
        cfg = json.loads(_base(stem).read_text())
        mutated = copy.deepcopy(cfg)
        edit(mutated)
        assert mutated != cfg, (stem, name)
        out[FRESH / f"v14_{stem}__{name}.json"] = json.dumps(mutated, indent=2) + "\n"
    return out


def main(argv: list[str]) -> int:
    files = build()
    if "--check" in argv:
        stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
        print("\n".join(stale) or f"{len(files)} files match")
        return 1 if stale else 0
    for path, text in files.items():
        path.write_text(text)
    for stem, name, what, _edit in MUTATIONS:
        base = _base(stem).relative_to(ROOT)
        print(f"- `v14_{stem}__{name}.json` — base `{base}` — mutation: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
