"""CFG011-CFG020: configs transformers' configuration classes or the engines refuse, and layers
kvdoctor cannot size.

Each rule states what transformers 5.24 or vLLM 0.33.0 does with the config (the catalog entry quotes
the exact message); none fires on a guess: a spec kvdoctor guessed has its errors lowered by
`guess_guard` (kvdoctor.checks.cfg_semantics.guess_guard), called from the check pipeline.
"""
from __future__ import annotations

from typing import Any, Iterable, TypeGuard

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.load.families import TRANSFORMERS_LAYER_TYPES, family_for
from kvdoctor.load.jsonfile import non_finite
from kvdoctor.model import FULL, MLA, SLIDING, SPARSE_MLA, UNKNOWN, Finding, ModelSpec

# Model types whose transformers configuration class validates hidden_size % num_attention_heads
# (`validate_architecture`); tests check this set against the installed classes.
VALIDATES_HIDDEN = frozenset({"llama", "gemma2", "vaultgemma", "gemma3_text", "deepseek_v2"})
# Integer layer periods, per family: (key, what transformers does with it).
PERIOD_KEYS = {"gemma3": "sliding_window_pattern", "cohere2": "sliding_window_pattern",
               "exaone4": "sliding_window_pattern", "qwen3_next": "full_attention_interval",
               "jamba": "attn_layer_period", "llama4": "no_rope_layer_interval"}
NEMOTRON_CHARS = "M*-E"
EXAONE_CHARS = "LG"
MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# Non-finite values transformers itself uses as defaults: "no upper limit".
UNBOUNDED_OK = ("time_step_limit",)
# Findings that rest on facts, not on the guessed semantics: transformers itself refused the config,
# a non-finite number, what the engine's own code says (ENG: its refusals and dry-run results), and
# vLLM's refusals of the config's model_type, architectures or auto_map and SGLang's config loader's (SGL150
# remote code, SGL151 an unknown model_type), which read no layer at all.
FACTS = frozenset({"CFG012", "CFG020", "VLM138", "VLM139", "VLM140", "VLM141", "VLM143", "SGL150", "SGL151"})

RULE = Rule(codes=tuple(f"CFG{n:03d}" for n in range(11, 21) if n != 14))  # CFG014 folded into CFG013


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def run(ctx: Context) -> Iterable[Finding]:
    spec = ctx.spec
    yield from _rejected(spec)
    yield from _heads(spec)
    yield from _periods(spec)
    yield from _pattern_strings(spec)
    yield from _linear_config(spec)
    yield from _mla(spec)
    yield from _non_finite(spec)
    yield from _unmodelled(spec)


def _rejected(spec: ModelSpec) -> Iterable[Finding]:
    rejected = spec.rejected
    if rejected is None:
        return
    # Point at the key the message names, as written ("`layer_types`") or in words ("hidden size").
    text = rejected.message + " " + rejected.message.lower().replace(" ", "_")
    key = next((k for k in sorted(spec.config, key=len, reverse=True) if k in text), "model_type")
    yield Finding.at("CFG012", f"transformers' {rejected.class_name} refuses this config: {rejected.error_class}: "
                     f"{rejected.message}", spec.key_source(key),
                     engine_error={"class": rejected.error_class, "message": rejected.message, "stage": "load"},
                     evidence={"class": rejected.class_name, "validator": rejected.validator})


def _heads(spec: ModelSpec) -> Iterable[Finding]:
    cfg = spec.config
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    attention = [l for l in spec.layers if l.kind in (FULL, SLIDING) or l.kind == "chunked_attention"]
    if _int(heads) and _int(kv) and heads > 0 and kv > 0 and attention:
        if kv > heads:
            yield Finding.at("CFG013", f"num_key_value_heads = {kv} is more than num_attention_heads = {heads}: "
                             f"vLLM asserts num_heads ({heads}) is not divisible by num_kv_heads ({kv}) when it "
                             "builds the first attention layer", spec.key_source("num_key_value_heads"),
                             engine_error={"class": "AssertionError", "stage": "load",
                                           "message": f"num_heads ({heads}) is not divisible by num_kv_heads ({kv})"},
                             evidence={"num_attention_heads": heads, "num_key_value_heads": kv})
        elif heads % kv:
            yield Finding.at("CFG013", f"num_attention_heads = {heads} is not a multiple of num_key_value_heads = {kv}: "
                             "grouped-query attention needs each key/value head to serve the same number of query heads",
                             spec.key_source("num_key_value_heads"),
                             engine_error={"class": "AssertionError", "stage": "load",
                                           "message": f"num_heads ({heads}) is not divisible by num_kv_heads ({kv})"},
                             evidence={"num_attention_heads": heads, "num_key_value_heads": kv})
    hidden = cfg.get("hidden_size")
    if cfg.get("head_dim") is None and _int(hidden) and _int(heads) and heads > 0 and hidden % heads and attention:
        validated = spec.model_type in VALIDATES_HIDDEN
        message = f"The hidden size ({hidden}) is not a multiple of the number of attention heads ({heads})."
        yield Finding.at("CFG015", f"hidden_size = {hidden} is not a multiple of num_attention_heads = {heads} and "
                         f"head_dim is not set: " + (f"transformers raises \"{message}\"" if validated else
                                                     f"engines derive head_dim = {hidden // heads} and drop the rest"),
                         spec.key_source("num_attention_heads"), severity=None if validated else "warning",
                         engine_error={"class": "ValueError", "message": message, "stage": "load"} if validated else None,
                         evidence={"hidden_size": hidden, "num_attention_heads": heads})


def _periods(spec: ModelSpec) -> Iterable[Finding]:
    family = family_for(spec.model_type)
    key = PERIOD_KEYS.get(family.name) if family else None
    if key is None or key not in spec.config:
        return
    value = spec.config[key]
    if isinstance(value, str) and spec.model_type == "exaone4":
        return  # a pattern string: CFG017
    if key != "attn_layer_period" and "layer_types" in spec.config:
        return  # layer_types wins in transformers; CFG005 compares the two
    if _int(value) and value > 0:
        offset = spec.config.get("attn_layer_offset", 4)
        if key == "attn_layer_period" and _int(offset) and offset >= value:
            message = f"attention layer offset ({offset}) must be smaller than attention layer period ({value})"
            yield Finding.at("CFG016", f"attn_layer_offset = {offset} is not below attn_layer_period = {value}: "
                             f"no layer would be attention; transformers raises \"{message}\"",
                             spec.key_source("attn_layer_offset"),
                             engine_error={"class": "ValueError", "message": message, "stage": "load"},
                             evidence={key: value, "attn_layer_offset": offset})
        elif key == "attn_layer_period" and _int(offset) and offset < 0:
            # JambaConfig only checks offset < period; its layers_block_type puts attention where
            # i % period == offset, which a negative offset never equals
            yield Finding.at("CFG016", f"attn_layer_offset = {offset} is negative: JambaConfig accepts it, but its "
                             f"layer pattern puts attention where layer % {value} == {offset}, which never holds, "
                             "so no layer is attention and the checkpoint's attention weights have no layer to load "
                             "into (vLLM and SGLang read the same pattern)", spec.key_source("attn_layer_offset"),
                             evidence={key: value, "attn_layer_offset": offset})
        return
    if value == 0 and _int(value):
        what = 'transformers raises ZeroDivisionError "integer modulo by zero" deriving layer_types'
        engine_error = {"class": "ZeroDivisionError", "message": "integer modulo by zero", "stage": "load"}
    else:
        what = "a layer period must be a positive integer; transformers derives a layout no period describes"
        engine_error = None
    yield Finding.at("CFG016", f"{key} = {value!r} is not a layer period: {what}", spec.key_source(key),
                     engine_error=engine_error, evidence={key: value})


def _pattern_strings(spec: ModelSpec) -> Iterable[Finding]:
    cfg = spec.config
    checks = []
    if spec.model_type == "exaone4" and isinstance(cfg.get("sliding_window_pattern"), str):
        checks.append(("sliding_window_pattern", EXAONE_CHARS))
    nemotron = cfg.get("hybrid_override_pattern")
    if spec.model_type == "nemotron_h" and isinstance(nemotron, (str, list)):
        checks.append(("hybrid_override_pattern", NEMOTRON_CHARS))
    elif spec.model_type == "nemotron_h" and "hybrid_override_pattern" in cfg and nemotron is not None:
        # NemotronHConfig._pattern_to_list iterates the pattern: a number is not iterable
        what = f"'{type(nemotron).__name__}' object is not iterable"
        yield Finding.at("CFG017", f"hybrid_override_pattern = {nemotron!r} is not a pattern string (one character "
                         f"per layer: {', '.join(NEMOTRON_CHARS)}): transformers' NemotronHConfig raises TypeError "
                         f"\"{what}\"", spec.key_source("hybrid_override_pattern"),
                         engine_error={"class": "TypeError", "message": what, "stage": "load"},
                         evidence={"hybrid_override_pattern": nemotron})
    for key, allowed in checks:
        pattern = cfg[key]
        bad = sorted({c if isinstance(c, str) else repr(c) for c in pattern
                      if not (isinstance(c, str) and len(c) == 1 and c in allowed)})
        src = spec.key_source(key)
        if bad or not pattern:
            what = f"characters {''.join(bad)!r} mean nothing" if bad else "it is empty"
            yield Finding.at("CFG017", f"{key} = {pattern!r}: {what} (expected only {', '.join(allowed)})", src,
                             engine_error={"class": "KeyError", "message": repr(bad[0]), "stage": "load"}
                             if bad and key == "hybrid_override_pattern" else None,
                             evidence={key: pattern, "unknown": bad})
        elif key == "hybrid_override_pattern" and _int(stated := cfg.get("num_hidden_layers")) and len(pattern) != stated:
            yield Finding.at("CFG027", f"{key} has {len(pattern)} entries but num_hidden_layers is {stated}: "
                             f"NemotronHConfig counts the layers from the pattern, so engines build {len(pattern)} "
                             "layers and ignore num_hidden_layers", src,
                             evidence={key: len(pattern), "num_hidden_layers": stated})
        elif key == "sliding_window_pattern" and "layer_types" not in cfg:
            yield Finding.at("CFG017", f"{key} = {pattern!r} is a string and layer_types is absent: transformers "
                             "5.24's Exaone4Config derives layer_types with `(i + 1) % sliding_window_pattern` and "
                             "raises TypeError \"unsupported operand type(s) for %: 'int' and 'str'\"", src,
                             engine_error={"class": "TypeError", "stage": "load",
                                           "message": "unsupported operand type(s) for %: 'int' and 'str'"},
                             evidence={key: pattern})


def _linear_config(spec: ModelSpec) -> Iterable[Finding]:
    if spec.model_type != "kimi_linear" or "layer_types" in spec.config:
        return
    lac = spec.config.get("linear_attn_config")
    missing = [k for k in ("kda_layers", "full_attn_layers") if not isinstance(lac, dict) or k not in lac]
    if not missing:
        return
    where = spec.key_source("linear_attn_config" if "linear_attn_config" in spec.config else "model_type")
    what = "is absent" if "linear_attn_config" not in spec.config else \
        ("is null" if lac is None else f"lacks {', '.join(missing)}")
    yield Finding.at("CFG018", f"kimi_linear's linear_attn_config {what}: vLLM 0.33.0 then builds every layer as MLA "
                     "(is_kda_layer is false) while transformers 5.24 derives KDA layers with a default 1-in-4 "
                     "pattern; the engines disagree on what every layer is, so no checkpoint fits both",
                     where, evidence={"missing": missing})


def _mla(spec: ModelSpec) -> Iterable[Finding]:
    if not any(l.kind in (MLA, SPARSE_MLA) for l in spec.layers):
        return
    for key in MLA_KEYS:
        if key in spec.config and not (_int(spec.config[key]) and spec.config[key] > 0):
            value = spec.config[key]
            yield Finding.at("CFG019", f"{key} = {value!r}: multi-head latent attention needs a positive integer "
                             f"here (transformers raises TypeError \"Field '{key}' expected int, got "
                             f"{type(value).__name__} (value: {value!r})\")", spec.key_source(key),
                             engine_error={"class": "TypeError", "stage": "load",
                                           "message": f"Field '{key}' expected int, got {type(value).__name__} "
                                                      f"(value: {value!r})"},
                             evidence={key: value})
    absent = [k for k in ("kv_lora_rank", "qk_rope_head_dim") if k not in spec.config and k not in spec.defaults]
    if absent and spec.family not in ("deepseek_v3", "deepseek_v32"):
        yield Finding.at("CFG019", f"MLA layers without {', '.join(absent)}: the latent width cached per token is "
                         "unknown", spec.key_source("model_type"), severity="warning", evidence={"absent": absent})


def _non_finite(spec: ModelSpec) -> Iterable[Finding]:
    for path, value in non_finite(spec.raw_config):
        if value == float("inf") and path.rsplit(".", 1)[-1] in UNBOUNDED_OK:
            continue  # the Mamba time-step limit's "no upper bound", transformers' own default
        yield Finding("CFG020", f"{path} = {value!r}: a non-finite number (Python's json and transformers read it, "
                      "and every computation with it gives inf or nan)", file="config.json",
                      line=spec.key_lines.get(path), key=path, evidence={"key": path, "value": repr(value)})


def _unmodelled(spec: ModelSpec) -> Iterable[Finding]:
    """Layers whose kind is a string transformers accepts but kvdoctor has no model for (a guessed
    spec's unknown layers are CFG002 / CFG009's business)."""
    if spec.semantics == "guess":
        return
    types = spec.config.get("layer_types")
    accepted = (lambda i: True) if spec.semantics == "transformers" else \
        (lambda i: isinstance(types, list) and i < len(types) and isinstance(types[i], str)
         and types[i] in TRANSFORMERS_LAYER_TYPES)
    unknown = [l.index for l in spec.layers if l.kind == UNKNOWN and accepted(l.index)]
    if unknown:
        yield Finding.at("CFG011", f"{len(unknown)} layers have a kind transformers accepts but kvdoctor does not "
                         f"model (first: layer {unknown[0]}); their caches are not checked or budgeted",
                         spec.key_source("layer_types" if "layer_types" in spec.config else "model_type"),
                         layer=unknown[0], evidence={"layers": unknown})


def guess_guard(finding: Finding, spec: ModelSpec) -> Finding:
    """A best-effort spec (a model type neither kvdoctor nor transformers knows) never yields an
    error from kvdoctor's own rules: they rest on guessed semantics, so their errors become warnings
    that say so. What the engine's own code says (ENG codes) and transformers' refusals stand."""
    if spec.semantics == "guess" and finding.severity == "error" and finding.code not in FACTS \
            and not finding.code.startswith("ENG"):
        finding.severity = "warning"
        finding.message += f" (model_type {spec.model_type!r} is unknown: kvdoctor guessed the layer semantics)"
        finding.evidence["guessed"] = True
    return finding
