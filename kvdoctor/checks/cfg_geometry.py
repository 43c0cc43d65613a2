"""CFG021-CFG026: numbers no engine can build a model from, or that make it compute wrongly: a null head
count, an odd rotary dimension, RoPE parameters the rotary embedding cannot use, a text_config whose layer
count contradicts the top level, linear-attention layer types in a model class that has none, and
linear-attention heads that do not divide.

Each rule says what transformers 5.25.0 or vLLM 0.33.0 does with the value (the catalog entry cites the
line). RoPE parameters and the text_config layer count are checked for every family (transformers only
warns about them); the rest for kvdoctor's own family table only, since a config transformers' class reads
is validated by that class (CFG012). A guessed spec's errors are lowered by `guess_guard`.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, TypeGuard

from kvdoctor.checks import Rule
from kvdoctor.checks.cfg_semantics import VALIDATES_HIDDEN
from kvdoctor.checks.context import Context
from kvdoctor.load.families import LINEAR_TYPE
from kvdoctor.model import CHUNKED, FULL, GDN, KDA, LINEAR, MAMBA, MLA, SLIDING, SPARSE_MLA, Finding, ModelSpec

RULE = Rule(codes=("CFG021", "CFG022", "CFG023", "CFG024", "CFG025", "CFG026"))

ATTENTION = (FULL, SLIDING, CHUNKED)
# Families of kvdoctor's table whose attention layers rotate queries and keys by RoPE over the whole head
# (Nemotron-H and Jamba attention carry no RoPE; MLA rotates qk_rope_head_dim, checked on its own).
ROPE_FAMILIES = frozenset({"llama", "mistral", "phi3", "qwen2", "gemma2", "gemma3", "gpt_oss", "olmo3", "exaone4",
                           "cohere2", "llama4", "qwen3_next", "falcon_h1", "lfm2"})
# Families of the table whose model classes build attention on every layer whatever layer_types says.
ATTENTION_ONLY_FAMILIES = frozenset({"llama", "mistral", "phi3", "qwen2", "gemma2", "gemma3", "gpt_oss", "olmo3",
                                     "exaone4", "cohere2", "deepseek_v3", "deepseek_v32", "llama4"})
LINEAR_KINDS = (GDN, KDA, MAMBA, LINEAR)
# RoPE types transformers 5.25.0 validates or initialises (modeling_rope_utils.py), the ones vLLM 0.33.0's
# get_rope builds (rotary_embedding/__init__.py), and the legacy names vLLM renames ("su", "mrope").
ROPE_TYPES = frozenset({"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "axial", "ntk",
                        "deepseek_yarn", "deepseek_llama_scaling", "mllama4", "bailing_mrope", "openpangu", "su",
                        "mrope"})
ROPE_KEYS = ("rope_scaling", "rope_parameters")
# What a scaling mapping carries besides its type; with no type transformers reads "default" and drops them.
SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                "short_factor", "long_factor", "beta_fast", "beta_slow", "mscale")


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run(ctx: Context) -> Iterable[Finding]:
    spec = ctx.spec
    # transformers' classes only warn about these: every family, a guessed one lowered by guess_guard; an
    # unknown RoPE type the engine's plan already refuses (vLLM's, CFG023) is reported once, by the plan
    planned = {(r.code, r.message) for r in ctx.plan.refusals}
    yield from (f for f in _rope(spec) if not (f.engine_error and (f.code, f.engine_error.get("message")) in planned))
    yield from _text_layers(spec)
    if spec.semantics != "table":
        return  # the class transformers read the config with validated the rest (CFG012 when it refused)
    yield from _null_heads(spec)
    yield from _odd_rotary(spec)
    yield from _linear_types(spec)
    yield from _linear_heads(spec)


def _null_heads(spec: ModelSpec) -> Iterable[Finding]:
    cfg = spec.config
    if "num_attention_heads" in cfg and cfg["num_attention_heads"] is None and \
            any(layer.kind in ATTENTION + (MLA, SPARSE_MLA) for layer in spec.layers):
        message = "Field 'num_attention_heads' expected int, got NoneType (value: None)"
        yield Finding.at("CFG021", "num_attention_heads is null: attention layers cannot be built without a head "
                         f"count; transformers' strict config raises TypeError \"{message}\", and engines divide "
                         "hidden_size by it", spec.key_source("num_attention_heads"),
                         engine_error={"class": "TypeError", "message": message, "stage": "load"},
                         evidence={"num_attention_heads": None})


def _partial_rotary(cfg: dict[str, Any]) -> Any:
    params = cfg.get("rope_parameters")
    inner = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    return cfg.get("partial_rotary_factor", inner if inner is not None else 1.0)


def _odd_rotary(spec: ModelSpec) -> Iterable[Finding]:
    """transformers' `validate_rope` refuses a fully rotated odd head (rotate_half splits it in two halves)."""
    cfg = spec.config
    if any(layer.kind in (MLA, SPARSE_MLA) for layer in spec.layers):
        key, dim = "qk_rope_head_dim", cfg.get("qk_rope_head_dim")  # MLA's rotary part, DeepSeek's head_dim
        factor: Any = 1.0
    elif spec.family in ROPE_FAMILIES:
        layer = next((layer for layer in spec.layers if layer.kind in ATTENTION and isinstance(layer.head_dim, int)
                      and layer.head_dim % 2), None)
        if layer is None:
            return
        dim, factor = layer.head_dim, _partial_rotary(cfg)
        key = "head_dim" if "head_dim" in cfg else "num_attention_heads"  # derived: hidden_size / heads
        if key != "head_dim" and spec.model_type in VALIDATES_HIDDEN:
            return  # transformers refuses the hidden size first: CFG015's error
    else:
        return
    if not (isinstance(dim, int) and dim > 4 and dim % 2 and _number(factor) and int(dim * factor) == dim):
        return
    message = (f"RoPE requires an even rotary dimension, but got `head_dim`={dim} with `partial_rotary_factor`="
               f"{float(factor)} for `full_attention`.")
    derived = "" if key in ("head_dim", "qk_rope_head_dim") else \
        f" (head_dim derived as hidden_size {cfg.get('hidden_size')} // num_attention_heads {cfg.get('num_attention_heads')})"
    yield Finding.at("CFG022", f"the rotary dimension is odd: {dim}{derived}; RoPE rotates pairs of values, so "
                     f"transformers raises ValueError \"{message}\"", spec.key_source(key),
                     engine_error={"class": "ValueError", "message": message, "stage": "load"},
                     evidence={"rotary_dim": dim, "partial_rotary_factor": factor})


def _rope_mappings(cfg: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every RoPE parameter mapping: one, or one per layer type."""
    for key in ROPE_KEYS:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, dict) and any(isinstance(v, dict) for v in value.values()):  # per layer type,
            # beside shared scalars such as original_max_position_embeddings (Laguna)
            yield from ((f"{key}.{kind}", params) for kind, params in value.items() if isinstance(params, dict))
        else:
            yield key, value


def _rope(spec: ModelSpec) -> Iterable[Finding]:
    cfg = spec.config
    theta = cfg.get("rope_theta")
    if "rope_theta" in cfg and theta is not None:
        yield from _theta(spec, "rope_theta", theta)
    for key, params in _rope_mappings(cfg):
        if not isinstance(params, dict):
            yield Finding.at("CFG023", f"{key} is a {type(params).__name__}, not a mapping of RoPE parameters: "
                             f"transformers' strict config raises TypeError \"Field 'rope_parameters' with value "
                             f"... doesn't match any type\" and engines read {key}[\"rope_type\"]",
                             spec.key_source(key), evidence={"key": key, "type": type(params).__name__})
            continue
        yield from _rope_params(spec, key, params)


def _theta(spec: ModelSpec, key: str, theta: Any) -> Iterable[Finding]:
    if _number(theta) and (theta > 0 or not math.isfinite(theta)):  # non-finite: the loader's input error
        return
    yield Finding.at("CFG023", f"{key} = {theta!r}: the RoPE base must be a positive number; the inverse "
                     "frequencies are 1 / base ** (2i / dim), infinite for a base of 0, nan for a negative one, "
                     "so every rotated query and key is garbage", spec.key_source(key), evidence={key: theta})


def _rope_params(spec: ModelSpec, key: str, params: dict[str, Any]) -> Iterable[Finding]:
    rope_type = params.get("rope_type", params.get("type"))
    src = spec.key_source(key)
    if rope_type is None:
        dropped = [k for k in SCALING_KEYS if k in params]
        if dropped:
            yield Finding.at("CFG023", f"{key} has {', '.join(dropped)} but no rope_type (or legacy type): "
                             "transformers reads it as 'default' and drops them, so the model runs unscaled past its "
                             "original context", src, evidence={"key": key, "ignored": dropped})
    elif not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        message = f"Unknown RoPE scaling type {rope_type}"
        yield Finding.at("CFG023", f"{key} rope_type {rope_type!r} is not a RoPE type transformers or the engines "
                         f"know: vLLM 0.33.0 raises ValueError \"{message}\" and transformers has no rotary "
                         "init for it", spec.key_source(f"{key}.rope_type" if "rope_type" in params else f"{key}.type"),
                         engine_error={"class": "ValueError", "message": message, "stage": "load"},
                         evidence={"key": key, "rope_type": rope_type})
    if "rope_theta" in params and params["rope_theta"] is not None:
        yield from _theta(spec, f"{key}.rope_theta", params["rope_theta"])
    factor = params.get("factor")
    if "factor" in params and not (_number(factor) and (factor > 0 or not math.isfinite(factor))):
        yield Finding.at("CFG023", f"{key}.factor = {factor!r}: a RoPE scaling factor must be a positive number; "
                         "transformers only warns (\"`rope_parameters`'s factor field must be a float or int >= 1, "
                         f"got {factor}\") and its rotary inits divide the frequencies or positions by it or take "
                         "its log, so the rotation is inf, nan, reversed or a TypeError", spec.key_source(f"{key}.factor"),
                         evidence={"key": key, "factor": factor})
    low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
    if rope_type == "llama3" and _number(low) and _number(high) and high < low:  # equal is Llama 4's own choice
        yield Finding.at("CFG023", f"{key}: llama3 high_freq_factor = {high} is below low_freq_factor = {low}: "
                         "transformers warns that high_freq_factor must be greater than low_freq_factor; the band "
                         "between the two wavelengths is then kept unscaled by vLLM's Llama3RotaryEmbedding and "
                         "divided by the factor by transformers, so the engines rotate those frequencies "
                         "differently and at most one matches training", spec.key_source(f"{key}.high_freq_factor"),
                         evidence={"key": key, "low_freq_factor": low, "high_freq_factor": high})


def _text_layers(spec: ModelSpec) -> Iterable[Finding]:
    raw = spec.raw_config
    top, inner = raw.get("num_hidden_layers"), spec.config.get("num_hidden_layers")
    if not spec.config_prefix or not isinstance(top, int) or not isinstance(inner, int) or top == inner:
        return
    from kvdoctor.load import hf_config

    if hf_config.owns(str(raw.get("model_type")), "num_hidden_layers") is not False:
        return  # the composite class counts another stack itself (BridgeTower, CLAP), or it is unknown
    yield Finding("CFG024", f"num_hidden_layers = {top} at the top level but text_config.num_hidden_layers = {inner}: "
                  "the two cannot both describe the checkpoint; the top-level class has no layer count of its own, "
                  f"transformers, vLLM and SGLang build the text model's {inner} layers from text_config, and "
                  f"whatever reads the top level sizes {top}",
                  file="config.json", line=spec.key_lines.get("num_hidden_layers"), key="num_hidden_layers",
                  evidence={"num_hidden_layers": top, "text_config.num_hidden_layers": inner})


def _linear_types(spec: ModelSpec) -> Iterable[Finding]:
    types = spec.config.get("layer_types")
    if spec.family not in ATTENTION_ONLY_FAMILIES or not isinstance(types, list):
        return
    linear = [i for i, t in enumerate(types) if t == LINEAR_TYPE and i < len(spec.layers)
              and spec.layers[i].kind in LINEAR_KINDS]
    if linear:
        yield Finding.at("CFG025", f"layer_types lists {len(linear)} linear_attention layers (first: layer "
                         f"{linear[0]}) but {spec.model_type}'s model class has no linear-attention mixer: "
                         "transformers and vLLM build attention on every layer whatever layer_types says, so "
                         "those layers' linear-attention weights have nowhere to load and their caches are "
                         "attention caches", spec.key_source("layer_types"), layer=linear[0],
                         evidence={"layers": linear})


def _linear_heads(spec: ModelSpec) -> Iterable[Finding]:
    cfg = spec.config
    k, v = cfg.get("linear_num_key_heads"), cfg.get("linear_num_value_heads")
    if spec.family != "qwen3_next" or not any(layer.kind == GDN for layer in spec.layers):
        return
    if isinstance(k, int) and isinstance(v, int) and k > 0 and v > 0 and v % k:
        yield Finding.at("CFG026", f"linear_num_value_heads = {v} is not a multiple of linear_num_key_heads = {k}: "
                         f"gated delta-net repeats each key head {v} // {k} = {v // k} times to meet the value "
                         f"heads, leaving {v - k * (v // k)} value heads without a query and key (the kernels "
                         "fail on the head counts)", spec.key_source("linear_num_value_heads"),
                         evidence={"linear_num_key_heads": k, "linear_num_value_heads": v})
