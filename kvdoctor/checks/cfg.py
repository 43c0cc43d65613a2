"""CFG: the config contradicts itself (layer types, windows, patterns, linear-attention layer lists)."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.load.families import TRANSFORMERS_LAYER_TYPES, TYPE_STRINGS, LINEAR_TYPE, Lookup, every_nth_full, family_for
from kvdoctor.model import CHUNKED, COMPRESSED, SLIDING, Finding

# Strings transformers accepts are not CFG002 even where kvdoctor cannot size them (CFG011 says so).
KNOWN_TYPE_STRINGS = set(TYPE_STRINGS) | {LINEAR_TYPE} | TRANSFORMERS_LAYER_TYPES
WINDOW_KEYS = ("sliding_window", "window_size")
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code")

RULE = Rule(codes=("CFG001", "CFG002", "CFG003", "CFG004", "CFG005", "CFG006", "CFG007", "CFG008", "CFG009",
                   "CFG010"))


def run(ctx: Context) -> Iterable[Finding]:
    spec, cfg = ctx.spec, ctx.spec.config
    n = spec.num_hidden_layers
    layer_types = cfg.get("layer_types")
    if "layer_types" in cfg and not isinstance(layer_types, list):
        yield Finding.at("CFG002", f"layer_types must be a list of strings, got {type(layer_types).__name__}",
                         spec.key_source("layer_types"))
        layer_types = None

    if isinstance(layer_types, list) and len(layer_types) != n:
        yield Finding.at(
            "CFG001",
            f"layer_types lists {len(layer_types)} layers but num_hidden_layers is {n}",
            spec.key_source("layer_types"), evidence={"layer_types": len(layer_types), "num_hidden_layers": n})

    if isinstance(layer_types, list) and spec.semantics != "transformers":  # transformers validated its list
        for i, value in enumerate(layer_types):
            if not isinstance(value, str) or value not in KNOWN_TYPE_STRINGS:
                yield Finding.at("CFG002", f"layer_types[{i}] = {value!r} is not a known layer type "
                                 f"(known: {', '.join(sorted(KNOWN_TYPE_STRINGS))})",
                                 spec.key_source("layer_types"), layer=i, evidence={"value": value})

    sliding = [layer.index for layer in spec.layers if layer.kind == SLIDING]
    null_window = [i for i in sliding if spec.layers[i].window is None]
    if null_window:
        # a window stated but switched off (Qwen2MoeConfig gives 0, its "no window", without use_sliding_window)
        off = cfg.get("sliding_window") is not None and cfg.get("use_sliding_window") is False
        why = "use_sliding_window is false, which leaves them no window" if off else "sliding_window is null"
        key = "use_sliding_window" if off else "sliding_window" if "sliding_window" in cfg else "layer_types"
        yield Finding.at("CFG003", f"{len(null_window)} layers are declared sliding_attention but {why}",
                         spec.key_source(key), layer=null_window[0], evidence={"layers": null_window})

    chunked = [layer.index for layer in spec.layers if layer.kind == CHUNKED and layer.window is None]
    if chunked:
        message = "Could not find an `attention_chunk_size` argument in the config, or it is not set"
        yield Finding.at("CFG003", f"{len(chunked)} layers are declared chunked_attention but attention_chunk_size "
                         f"is null: transformers raises \"{message}\" building their mask, and vLLM 0.33.0's Llama 4 "
                         "attention falls back to full attention on them", spec.key_source(
                             "attention_chunk_size" if "attention_chunk_size" in cfg else "layer_types"),
                         layer=chunked[0], engine_error={"class": "ValueError", "message": message, "stage": "prefill"},
                         evidence={"layers": chunked})

    window_key = next((k for k in WINDOW_KEYS if cfg.get(k) is not None), None)
    # DeepSeek-V4's compressed layers keep a sliding-window branch of recent tokens beside the compressed
    # ones (DeepseekV4Config: "used in every attention block's sliding-window branch"): the window is theirs.
    windowed = sliding or any(layer.kind == COMPRESSED for layer in spec.layers)
    if window_key and not windowed and cfg.get("use_sliding_window") is not False:
        yield Finding.at(
            "CFG004",
            f"{window_key} = {cfg[window_key]} is set but no layer is sliding; an engine that applies the "
            f"window to every layer will silently cut the context of all {n} layers to {cfg[window_key]} tokens",
            spec.key_source(window_key), evidence={"window": cfg[window_key]})

    yield from _pattern_vs_layer_types(ctx, layer_types)
    yield from _linear_lists(ctx)

    if spec.semantics == "guess":
        guessed = sorted({src.ref for layer in spec.layers for src in layer.sources.values() if src.kind == "key"})
        known = "no installed transformers knows it either" if spec.rejected is None else \
            "transformers refused the config (CFG012)"
        yield Finding.at("CFG009", f"model_type {spec.model_type!r} has no kvdoctor family and {known}; the layer "
                         f"spec is a best effort from the common keys ({', '.join(guessed) or 'none'}), every "
                         "layer's kind guessed", spec.key_source("model_type"), evidence={"guessed_from": guessed})
    for key in REMOTE_CODE_KEYS:
        if key in spec.raw_config:
            yield Finding("CFG010", f"config.json has {key!r}: the model ships its own code; kvdoctor does not run it "
                          "(engines ask for --trust-remote-code)", file="config.json",
                          line=spec.key_lines.get(key), key=key)


def _pattern_vs_layer_types(ctx: Context, layer_types) -> Iterable[Finding]:
    spec, cfg = ctx.spec, ctx.spec.config
    pattern = cfg.get("sliding_window_pattern")
    if pattern is None or not isinstance(layer_types, list):
        return
    family = family_for(spec.model_type)
    look = Lookup(cfg, family.defaults if family else {}, spec.key_source)
    from_pattern = [kind for kind, _ in every_nth_full("sliding_window_pattern")(look, len(layer_types))]
    declared = [SLIDING if t == "sliding_attention" else "other" for t in layer_types]
    expected = [SLIDING if k == SLIDING else "other" for k in from_pattern]
    diff = [i for i, (a, b) in enumerate(zip(declared, expected)) if a != b]
    if diff:
        yield Finding.at(
            "CFG005",
            f"sliding_window_pattern = {pattern!r} and layer_types disagree on {len(diff)} layers "
            f"(first: layer {diff[0]} is {layer_types[diff[0]]!r} in layer_types)",
            spec.key_source("sliding_window_pattern"), layer=diff[0], evidence={"layers": diff})


def _linear_lists(ctx: Context) -> Iterable[Finding]:
    """Kimi Linear's 1-indexed `kda_layers` / `full_attn_layers` must partition 1..num_hidden_layers."""
    spec = ctx.spec
    lac = spec.config.get("linear_attn_config")
    if not isinstance(lac, dict):
        return
    n = spec.num_hidden_layers
    lists = {key: lac.get(key) for key in ("kda_layers", "full_attn_layers") if key in lac}
    if not lists:
        return
    seen: dict[int, str] = {}
    for key, values in lists.items():
        src = spec.key_source(f"linear_attn_config.{key}")
        if not isinstance(values, list):
            yield Finding.at("CFG008", f"linear_attn_config.{key} must be a list of 1-indexed layer numbers",
                             src)
            continue
        for value in values:
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= n:
                yield Finding.at("CFG008", f"linear_attn_config.{key} names layer {value!r}, outside 1..{n} "
                                 "(these lists are 1-indexed)", src, evidence={"value": value})
            elif value in seen:
                yield Finding.at("CFG006", f"layer {value} (1-indexed) is in both linear_attn_config.{seen[value]} "
                                 f"and linear_attn_config.{key}", src, layer=value - 1)
            else:
                seen[value] = key
    gaps = [i for i in range(1, n + 1) if i not in seen]
    if gaps:
        yield Finding.at("CFG007", f"{len(gaps)} layers are in neither kda_layers nor full_attn_layers "
                         f"(1-indexed: {gaps[:8]}{'...' if len(gaps) > 8 else ''})",
                         spec.key_source("linear_attn_config"), layer=gaps[0] - 1, evidence={"layers": gaps})
