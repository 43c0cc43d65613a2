"""Write held-out sets 14, 15 and 16 (issue 43): one change each to real configs of the hard families.

    python3 tools/mutate_heldout.py [--set 15|16] [--check]

Each mutation is one edit a fine-tune, a pruned or quantized release or a user's local copy makes to a published
config: a window or a layer-type pattern, an attention or linear-attention head count, fewer layers with the layer
lists kept consistent, an MLA latent size, a quantization scheme, a VLM's text_config field. The list is fixed (no
draw), so the output is the same on every run; `--check` only verifies the committed files match it. Writes
fixtures/configs/fresh/v14_<base>__<mutation>.json and prints the SOURCES lines for SOURCES-vllm.md.

Set 15 (`--set 15`) applies the issue's own mutation kinds instead: the per-layer list (`layer_types`,
`layers_block_type` or `hybrid_override_pattern`) shifted by one, truncated to half, one entry dropped; every layer
typed sliding; one more MTP layer; `sliding_window: null`; a window without `layer_types`. Each base of SET15_BASES
gets ONE kind, drawn with a fixed seed among the kinds its config's structure allows (the least used so far first,
so that every kind is drawn), into fixtures/configs/fresh/v15_<base>__<mutation>.json.

Set 16 (`--set 16`, seed 16) draws both: its kinds are set 15's and set 14's edits made generic (a window or an
attention chunk halved, full attention every second layer, KV or linear-attention heads halved, the layers pruned to
half with their lists, an MLA latent or rope size or a DSA index head halved, the context doubled, the SSM cache
dtype switched, an AWQ scheme added, an FP8 KV scheme added, FP8 weight blocks 64). Bases are every real config of a
hard family by its structure (a per-layer list, a window or a chunk, linear attention, MLA, a quantization scheme, a
VLM wrapper), in a seeded order; each gets the least-drawn kind it allows that neither set 14 nor set 15 applied to
it, into fixtures/configs/fresh/v16_<base>__<mutation>.json.
"""
from __future__ import annotations

import copy
import json
import random
import re
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


# Set 15: real configs of the hard families that set 14 did not use as bases.
SET15_BASES = [
    "Qwen__Qwen3.5-122B-A10B", "Qwen__Qwen3.5-35B-A3B", "Qwen__Qwen3.5-397B-A17B", "nvidia__Qwen3.6-27B-NVFP4",
    "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-FP8",
    "nvidia__NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4", "MiniMaxAI__MiniMax-M2.5", "MiniMaxAI__MiniMax-M3",
    "LGAI-EXAONE__EXAONE-4.0-32B", "LGAI-EXAONE__EXAONE-4.5-33B", "meta-llama__Llama-4-Maverick-17B-128E-Instruct",
    "zai-org__GLM-4.5", "zai-org__GLM-4.5V", "zai-org__GLM-4.7-Flash", "moonshotai__Kimi-K2.5", "moonshotai__Kimi-K3",
    "deepseek-ai__DeepSeek-V3.2", "deepseek-ai__DeepSeek-V4-Flash", "openai__gpt-oss-120b", "google__medgemma-27b-it",
    "nvidia__Gemma-4-26B-A4B-NVFP4", "poolside__Laguna-XS.2-FP8", "mistralai__Ministral-3-3B-Instruct-2512",
]
SET15_SEED = 15
LAYER_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern")
MTP_KEYS = ("num_nextn_predict_layers", "num_mtp_modules", "mtp_num_layers")
SLIDING, FULL = "sliding_attention", "full_attention"


def _layers(cfg: dict) -> dict:
    """The mapping that holds the layers: a wrapper's text_config when it has them."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else cfg


def _layer_list(text: dict) -> str | None:
    return next((key for key in LAYER_LISTS if isinstance(text.get(key), (list, str)) and text[key]), None)


def _kinds(text: dict) -> list[str]:
    """The issue's mutation kinds this config's structure allows (a kind that would change nothing is left out)."""
    key = _layer_list(text)
    window = text.get("sliding_window") is not None
    kinds = []
    if key:
        kinds += ["truncated", "dropped_entry"] + (["shifted"] if len(set(text[key])) > 1 else [])
    if window:
        kinds += ["all_sliding", "null_window"]
    if any(k in text for k in MTP_KEYS) or isinstance(text.get("layer_types"), list):
        kinds.append("extra_mtp")
    if "layer_types" in text or not window:
        kinds.append("window_without_layer_types")
    return kinds


def _mutate15(text: dict, kind: str, rng: random.Random) -> tuple[str, str]:
    """Apply one kind to the layer mapping; return (file-name suffix, what changed)."""
    key = _layer_list(text)
    if kind == "shifted":
        assert key
        text[key] = text[key][1:] + text[key][:1]
        return f"{key}_shifted", f"`{key}` rotated left by one (entry i is the published entry i+1)"
    if kind == "truncated":
        assert key
        n = len(text[key]) // 2
        text[key] = text[key][:n]
        return f"{key}_truncated_{n}", f"`{key}` cut to its first {n} entries, `num_hidden_layers` kept"
    if kind == "dropped_entry":
        assert key
        i = rng.randrange(len(text[key]))
        text[key] = text[key][:i] + text[key][i + 1:]
        return f"{key}_dropped_{i}", f"`{key}` entry {i} removed (the later entries move up one)"
    if kind == "all_sliding":
        text["layer_types"] = [SLIDING] * text["num_hidden_layers"]
        return "all_sliding", f"`layer_types`: every one of the {text['num_hidden_layers']} layers sliding_attention"
    if kind == "null_window":
        old = text["sliding_window"]
        text["sliding_window"] = None
        return "sliding_window_null", f"`sliding_window` {old} -> null"
    if kind == "extra_mtp":
        mtp = next((k for k in MTP_KEYS if k in text), None)
        if mtp:
            text[mtp] += 1
            return f"{mtp}_plus_1", f"`{mtp}` {text[mtp] - 1} -> {text[mtp]} (one more MTP layer)"
        text["layer_types"] = text["layer_types"] + [FULL]
        return "layer_types_mtp_appended", "`layer_types`: one full_attention entry appended (an MTP layer's)"
    assert kind == "window_without_layer_types"
    had = text.pop("layer_types", None) is not None
    if text.get("sliding_window") is None:
        text["sliding_window"] = 4096
        return "window_4096_no_layer_types", ("`layer_types` removed, " if had else "") + "`sliding_window` 4096 added"
    return "no_layer_types", f"`layer_types` removed, `sliding_window` {text['sliding_window']} kept"


def _hard(cfg: dict) -> bool:
    """A hard family by structure alone: per-layer types, a window or chunk, linear attention, MLA, quantized, a VLM."""
    text = _layers(cfg)
    keys = LAYER_LISTS + ("linear_attn_config", "kv_lora_rank", "sliding_window", "attention_chunk_size",
                          "linear_num_value_heads", "mamba_ssm_cache_dtype")
    return (any(text.get(k) is not None for k in keys) or text is not cfg
            or "quantization_config" in cfg or "quantization_config" in text)


# Set 14's edits, by kind (what `_kinds16` calls them), so that set 16 leaves those (base, kind) pairs out.
SET14_KINDS = {
    "full_attention_interval_2": "full_every_2", "text_layers_48": "layers_pruned",
    "text_linear_value_heads_16": "linear_heads_halved", "full_attn_every_3": "full_every_2",
    "layers_60": "layers_pruned", "ssm_cache_bf16": "ssm_cache_dtype", "max_position_32k": "context_doubled",
    "attn_period_4": "full_every_2", "layers_30": "layers_pruned", "qk_rope_head_dim_32": "rope_dim_halved",
    "kv_lora_rank_256": "kv_lora_rank_halved", "index_head_dim_64": "index_head_dim_halved",
    "sliding_window_256": "window_halved", "text_sliding_window_512": "window_halved",
    "sliding_window_pattern_4": "full_every_2", "text_layer_types_every_4": "full_every_2",
    "sliding_window_512": "window_halved", "layer_types_every_3": "full_every_2", "text_chunk_4096": "chunk_halved",
    "weight_block_64": "weight_block_64", "awq_g128": "awq_g128", "fp8_kv_scheme": "fp8_kv_scheme",
    "text_kv_heads_4": "kv_heads_halved", "text_sliding_window_4096": "window_halved",
}
SET16_SEED = 16
SET16_SIZE = 22
PRUNED_LISTS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "hybrid_layer_pattern",
                "moe_layer_freq", "mlp_layer_types")


def _quant(cfg: dict) -> dict | None:
    return cfg.get("quantization_config") or _layers(cfg).get("quantization_config")


def _kinds16(cfg: dict, text: dict) -> list[str]:
    """Set 14's edits, made generic, that this config's structure allows."""
    kinds = []
    window, chunk = text.get("sliding_window"), text.get("attention_chunk_size")
    if isinstance(window, int) and window > 1:
        kinds.append("window_halved")
    if isinstance(chunk, int) and chunk > 1:
        kinds.append("chunk_halved")
    types = text.get("layer_types")
    if isinstance(types, list) and FULL in types and len(set(types)) == 2 and types != _full_every_2(types):
        kinds.append("full_every_2")
    if isinstance(text.get("num_key_value_heads"), int) and text["num_key_value_heads"] % 2 == 0:
        kinds.append("kv_heads_halved")
    if isinstance(text.get("linear_num_value_heads"), int) and text["linear_num_value_heads"] % 2 == 0:
        kinds.append("linear_heads_halved")
    if "linear_attn_config" not in text and not any(k in text for k in MTP_KEYS):
        kinds.append("layers_pruned")
    for key in ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"):
        if isinstance(text.get(key), int) and text.get("kv_lora_rank" if key != "index_head_dim" else key):
            kinds.append({"kv_lora_rank": "kv_lora_rank_halved", "qk_rope_head_dim": "rope_dim_halved",
                          "index_head_dim": "index_head_dim_halved"}[key])
    if isinstance(text.get("max_position_embeddings"), int):
        kinds.append("context_doubled")
    if text.get("mamba_ssm_cache_dtype") in ("float32", "bfloat16"):
        kinds.append("ssm_cache_dtype")
    quant = _quant(cfg)
    if quant is None:
        kinds.append("awq_g128")
    elif quant.get("quant_method") == "compressed-tensors" and not quant.get("kv_cache_scheme"):
        kinds.append("fp8_kv_scheme")
    elif isinstance(quant.get("weight_block_size"), list) and quant["weight_block_size"] != [64, 64]:
        kinds.append("weight_block_64")
    return kinds


def _full_every_2(types: list[str]) -> list[str]:
    other = next(t for t in types if t != FULL)
    return [FULL if i % 2 else other for i in range(len(types))]


def _halve(text: dict, key: str) -> tuple[str, str]:
    old = text[key]
    text[key] = old // 2
    return f"{key}_{old // 2}", f"`{key}` {old} -> {old // 2}"


def _mutate16(cfg: dict, text: dict, kind: str) -> tuple[str, str]:
    """Apply one of set 14's kinds, made generic, to the layer mapping; return (file-name suffix, what changed)."""
    simple = {"chunk_halved": "attention_chunk_size", "kv_heads_halved": "num_key_value_heads",
              "linear_heads_halved": "linear_num_value_heads", "kv_lora_rank_halved": "kv_lora_rank",
              "rope_dim_halved": "qk_rope_head_dim", "index_head_dim_halved": "index_head_dim"}
    if kind in simple:
        return _halve(text, simple[kind])
    if kind == "window_halved":
        name, what = _halve(text, "sliding_window")
        if isinstance(text.get("sliding_window_size"), int):
            text["sliding_window_size"] = text["sliding_window"]
            what += " (and `sliding_window_size`, which states it again)"
        return name, what
    if kind == "full_every_2":
        text["layer_types"] = _full_every_2(text["layer_types"])
        return "layer_types_full_every_2", "`layer_types`: full_attention at every second layer (1-based), the other type between"
    if kind == "layers_pruned":
        old = text["num_hidden_layers"]
        _truncate16(text, old // 2)
        return f"layers_{old // 2}", f"`num_hidden_layers` {old} -> {old // 2}, per-layer lists cut to match"
    if kind == "context_doubled":
        old = text["max_position_embeddings"]
        text["max_position_embeddings"] = 2 * old
        return f"max_position_{2 * old}", f"`max_position_embeddings` {old} -> {2 * old}"
    if kind == "ssm_cache_dtype":
        old = text["mamba_ssm_cache_dtype"]
        text["mamba_ssm_cache_dtype"] = new = "bfloat16" if old == "float32" else "float32"
        return f"ssm_cache_{new}", f"`mamba_ssm_cache_dtype` {old} -> {new}"
    if kind == "awq_g128":
        cfg["quantization_config"] = dict(AWQ_G128)
        return "awq_g128", "an AutoAWQ 4-bit GEMM `quantization_config`, group size 128 (as Qwen's -AWQ releases)"
    quant = _quant(cfg)
    assert quant is not None
    if kind == "fp8_kv_scheme":
        quant["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                    "symmetric": True}
        return "fp8_kv_scheme", "`quantization_config.kv_cache_scheme`: FP8 per-tensor static (llm-compressor's)"
    assert kind == "weight_block_64"
    old = quant["weight_block_size"]
    quant["weight_block_size"] = [64, 64]
    return "weight_block_64", f"`quantization_config.weight_block_size` {old} -> [64, 64]"


def _truncate16(text: dict, n: int) -> None:
    """Keep the first n decoder layers, every per-layer list cut to match (a pruned derivative)."""
    text["num_hidden_layers"] = n
    for key in PRUNED_LISTS:
        if isinstance(text.get(key), (list, str)):
            text[key] = text[key][:n]


def build16() -> tuple[dict[Path, str], list[str]]:
    """Set 16's files and SOURCES lines: hard real bases in a seeded order, each the least-drawn kind left to it."""
    used_before = {(stem, SET14_KINDS[name]) for stem, name, _what, _edit in MUTATIONS}
    used_before |= {(m.group(1), m.group(2)) for line in build15()[1]
                    if (m := re.search(r"base `fixtures/configs/\w+/(.+?)\.json` — kind `(\w+)`", line))}
    rng = random.Random(SET16_SEED)
    order = sorted(p.stem for p in REAL.glob("*.json") if _hard(json.loads(p.read_text())))
    rng.shuffle(order)
    used: dict[str, int] = {}
    files, lines = {}, []
    for stem in order[:SET16_SIZE]:
        cfg = json.loads(_base(stem).read_text())
        mutated = copy.deepcopy(cfg)
        text = _layers(mutated)
        kind = _least_drawn(rng, sorted(k for k in _kinds(text) + _kinds16(mutated, text)
                                        if (stem, k) not in used_before), used)
        name, what = _mutate15(text, kind, rng) if kind in _kinds(_layers(cfg)) else _mutate16(mutated, text, kind)
        if text is not mutated and not what.startswith("`quantization") and kind != "awq_g128":
            what = re.sub(r"`(\w+)`", r"`text_config.\1`", what)
        _record(files, lines, 16, stem, cfg, mutated, name, kind, what)
    return files, sorted(lines)


def build15() -> tuple[dict[Path, str], list[str]]:
    """Set 15's files and SOURCES lines: bases in a seeded order, each the least-drawn kind it allows."""
    rng = random.Random(SET15_SEED)
    order = SET15_BASES[:]
    rng.shuffle(order)
    used: dict[str, int] = {}
    files, lines = {}, []
    for stem in order:
        cfg = json.loads(_base(stem).read_text())
        mutated = copy.deepcopy(cfg)
        text = _layers(mutated)
        kind = _least_drawn(rng, _kinds(text), used)
        name, what = _mutate15(text, kind, rng)
        if text is not mutated:
            what = re.sub(r"`(\w+)`", r"`text_config.\1`", what)
        _record(files, lines, 15, stem, cfg, mutated, name, kind, what)
    return files, sorted(lines)


def _least_drawn(rng: random.Random, kinds: list[str], used: dict[str, int]) -> str:
    """One of the kinds drawn least so far (in the order given), chosen by rng and counted as drawn."""
    fewest = min(used.get(k, 0) for k in kinds)
    kind = rng.choice([k for k in kinds if used.get(k, 0) == fewest])
    used[kind] = used.get(kind, 0) + 1
    return kind


def _record(files: dict[Path, str], lines: list[str], number: int, stem: str, cfg: dict, mutated: dict, name: str,
            kind: str, what: str) -> None:
    """Add set `number`'s mutated config and its SOURCES line."""
    assert mutated != cfg, (stem, name)
    path = FRESH / f"v{number}_{stem}__{name}.json"
    files[path] = json.dumps(mutated, indent=2) + "\n"
    lines.append(f"- `{path.name}` — base `{_base(stem).relative_to(ROOT)}` — kind `{kind}`: {what}")


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
    chosen = argv[argv.index("--set") + 1] if "--set" in argv[:-1] else "14"
    if chosen not in ("14", "15", "16"):
        print(f"no set {chosen} (14, 15 or 16)", file=sys.stderr)
        return 2
    if chosen == "15":
        files, lines = build15()
    elif chosen == "16":
        files, lines = build16()
    else:
        files = build()
        lines = [f"- `v14_{stem}__{name}.json` — base `{_base(stem).relative_to(ROOT)}` — mutation: {what}"
                 for stem, name, what, _edit in MUTATIONS]
    if "--check" in argv:
        stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
        print("\n".join(stale) or f"{len(files)} files match")
        return 1 if stale else 0
    for path, text in files.items():
        path.write_text(text)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
