"""Start-up refusals SGLang 0.5.23 raises for a config and settings, predicted without running it.

Each carries the exception class and the exact text SGLang (or the transformers config class it loads
the config with) prints, with the numbers filled in, and the pinned source line that raises it.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.engines.base import Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import at
from kvdoctor.engines.releases import key as release_key
from kvdoctor.engines.sglang import archs, pools, releases, swa
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.load import hf_config
from kvdoctor.model import SPARSE_MLA, ModelSpec

CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
TRANSFORMERS = "https://github.com/huggingface/transformers/blob/v5.20.2/src/transformers/"
TRANSFORMERS_LAYER_TYPES = TRANSFORMERS + "configuration_utils.py#L694"
# SGLang 0.5.23's venv runs transformers 5.19.0, whose DeepseekV4Config words its own length check
DSV4_CONFIG_CLASS = ("https://github.com/huggingface/transformers/blob/v5.19.0/src/transformers/models/deepseek_v4/"
                     "configuration_deepseek_v4.py#L211")
# Config classes that check the per-layer lists themselves in their `validate_architecture` (before
# transformers' generic layer_types validator): list key -> the line raising for it.
OWN_LENGTH_VALIDATORS = {
    "LagunaForCausalLM": (("num_attention_heads_per_layer", "models/laguna/configuration_laguna.py#L161"),
                          ("layer_types", "models/laguna/configuration_laguna.py#L166")),
}
# Config classes that build `per_layer_config` from the layer_types entries typed full_attention
# (Gemma-4's global layers, models/gemma4/configuration_gemma4.py:219) and then check its keys.
PER_LAYER_CONFIG_ARCHS = frozenset({"Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"})


registry = archs.registry  # the shipped facts of SGLang's config loader and model registry
AUTO_CONFIG = TRANSFORMERS + "models/auto/configuration_auto.py"
REMOTE_CODE = TRANSFORMERS + "dynamic_module_utils.py#L788"


def config_types(release: str = PINS["sglang"]) -> frozenset[str]:
    return registry(release)["model_types"]


def config_loader(spec: ModelSpec, release: str = PINS["sglang"]) -> Refusal | None:
    """AutoConfig with trust_remote_code off (SGLang's default, `utils/hf_transformers/config.py#L228`):
    a config that names its own configuration code for a model type SGLang's transformers does not know is
    refused, and so is a model type nobody registered. SGLang is given the model's folder (or Hub id), and
    the message names it."""
    raw = spec.raw_config
    model_type = raw.get("model_type")
    if model_type is None and not (isinstance(raw.get("auto_map"), dict) and raw["auto_map"].get("AutoConfig")):
        return None  # no model_type and no configuration code: the loader refuses such a config as bad input
    if model_type is not None and (not isinstance(model_type, str) or model_type in config_types(release)):
        return None
    name = spec.hf_id or str(spec.model_dir)
    auto = raw.get("auto_map")
    class_ref = auto.get("AutoConfig") if isinstance(auto, dict) else None
    if isinstance(class_ref, list):
        class_ref = class_ref[0] if class_ref else None
    evidence = {"model_type": model_type, "sglang": f"v{release}", "transformers": registry(release)["transformers"]}
    if isinstance(class_ref, str) and class_ref:
        if "--" in class_ref:
            upstream = class_ref.split("--")[0]
            head = (f"The repository {name} references custom code contained in {upstream} which must be executed "
                    f"to correctly load the model. You can inspect the repository content at https://hf.co/{upstream} .\n")
        else:
            where = f"https://hf.co/{name}" if spec.hf_id else name
            head = (f"The repository {name} contains custom code which must be executed to correctly load the model. "
                    f"You can inspect the repository content at {where} .\n")
        message = (f"{head} You can inspect the repository content at https://hf.co/{name}.\n"
                   "Please pass the argument `trust_remote_code=True` to allow custom code to be run.")
        return Refusal("SGL150", "ValueError", message, "startup", key="auto_map", source=REMOTE_CODE,
                       evidence={**evidence, "auto_map.AutoConfig": class_ref})
    message = (f"The checkpoint you are trying to load has model type `{model_type}` but Transformers does not "
               "recognize this architecture. This could be because of an issue with the checkpoint, or because your "
               "version of Transformers is out of date.\n\nYou can update Transformers with the command `pip install "
               "--upgrade transformers`. If this does not work, and the checkpoint is very new, then there may not be "
               "a release version that supports this model yet. In this case, you can get the most up-to-date code by "
               "installing Transformers from source with the command "
               "`pip install git+https://github.com/huggingface/transformers.git`")
    return Refusal("SGL151", "ValueError", message, "startup", key="model_type", source=AUTO_CONFIG + "#L430",
                   evidence=evidence)


DSA_KV_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3")


def dsa_kv_dtype(spec: ModelSpec, settings: SglangSettings) -> Refusal | None:
    """ServerArgs' DeepSeek-DSA override (arg_groups/overrides.py:541 at 0.5.23) keeps a bfloat16 or fp8_e4m3
    KV cache for a model whose MLA layers carry the sparse indexer, and asserts on any other dtype
    (fp8_e5m2), before the model config is built."""
    if SPARSE_MLA not in spec.kinds() or settings.kv_cache_dtype in DSA_KV_DTYPES:
        return None
    return Refusal("SGL288", "AssertionError", "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype",
                   "startup", setting="sglang.kv_cache_dtype",
                   source="https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/"
                          "overrides.py#L541")


# DeepSeek-V4's own KV dtype pass (_deepseek_v4_kv_cache_dtype, arg_groups/overrides.py:892-913 at 0.5.23, CUDA):
# `auto` becomes fp8_e4m3, and the result must be fp8_e4m3 or bfloat16. bf16 is not refused here: whether ServerArgs
# has spelled it bfloat16 by then is not measured.
DSV4_KV_DTYPES = ("auto", "fp8_e4m3", "bfloat16", "bf16")


def dsv4_kv_dtype(spec: ModelSpec, settings: SglangSettings) -> Refusal | None:
    arch = archs.serving_arch(spec.raw_config)
    if arch != "DeepseekV4ForCausalLM" or settings.kv_cache_dtype in DSV4_KV_DTYPES:
        return None
    return Refusal("SGL318", "AssertionError", f"{settings.kv_cache_dtype} is not supported for {arch}",
                   "startup", setting="sglang.kv_cache_dtype",
                   source="https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/"
                          "overrides.py#L892")


def _text_config_view(spec: ModelSpec) -> dict[str, Any]:
    """The attributes SGLang's `get_context_length` reads, as transformers' configuration class resolves them
    (class defaults for null or missing keys; Gemma-3 keeps its RoPE scaling per layer type), where the
    installed transformers has the class; else the config's own keys."""
    model_type = spec.config.get("model_type") or spec.model_type
    stated = any(isinstance(spec.config.get(key), int) for key in CONTEXT_KEYS)
    if stated and not isinstance(spec.config.get("rope_scaling"), dict):
        return dict(spec.config)  # the class keeps a stated length as it is
    try:
        view = hf_config.read(model_type, spec.config, CONTEXT_KEYS + ("rope_scaling",)) \
            if isinstance(model_type, str) else None
    except hf_config.Rejected:
        view = None
    if view is None:
        return dict(spec.config)
    return {**spec.config, **view.resolved}


def config_class_rejects(spec: ModelSpec) -> Refusal | None:
    """transformers' configuration class for the model type refuses the config (a strict-dataclass validator,
    Falcon-H1's `mamba_n_heads must divide ...`): SGLang's AutoConfig builds that class first and stops with its
    error as raised. Read with the installed transformers: the loader's own reading where it ran the class, else
    the class itself for the families whose class validates (`hf_config.MAMBA_CLASS_CHECKED`), and for Nemotron-H
    with a `layer_types`, which NemotronHConfig reads as its block types and refuses other entries of (held-out set
    16: "`layers_block_type` contains invalid types: {'sliding_attention'}", as vLLM's profile reads it)."""
    rejected = spec.rejected
    model_type = spec.raw_config.get("model_type")
    reads_class = model_type in hf_config.MAMBA_CLASS_CHECKED or (
        model_type == "nemotron_h" and "layer_types" in spec.raw_config)
    if rejected is None and reads_class and isinstance(model_type, str):  # a family kvdoctor reads itself
        try:
            hf_config.read(model_type, spec.raw_config, ())
        except hf_config.Rejected as exc:
            rejected = exc
    if rejected is None:
        return None
    return Refusal("SGL155", rejected.outer_class, rejected.outer_message.strip(), "startup",
                   key="model_type", source=archs.ref("utils/hf_transformers/config.py#L228"),
                   evidence={"config_class": rejected.class_name, "validator": rejected.validator,
                             "inner": f"{rejected.error_class}: {rejected.message}"})


def derived_context_length(spec: ModelSpec) -> int:
    """SGLang's `get_context_length` (utils/hf_transformers/common.py:677): the first context attribute of the
    text config, times the rope-scaling factor unless the scaling states its original length or is
    llama3-style (a per-layer-type scaling has no top-level factor). A composite config served with its class's
    default text config has that config's context, as the registry read it with SGLang's function, even where the
    top level states the same geometry (Step-3.7: Step3p7Config builds a default Step3p5Config, whose `max_seq_len`
    of 128000, configs/step3p5.py:17, comes before any `max_position_embeddings` the top level states,
    configs/step3p7.py:75-78)."""
    served = archs.served_text_config(spec.raw_config)
    if served is not None and isinstance(served.get("context_length"), int):
        return served["context_length"]
    cfg = _text_config_view(spec)
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else None
    factor = 1
    if scaling:
        factor = scaling.get("factor", 1)
        if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_KEYS:
        if cfg.get(key) is not None:
            return int(factor * cfg[key])
    return spec.defaults.get("max_position_embeddings") or 2048


def context_too_long(spec: ModelSpec, settings: SglangSettings) -> Refusal | None:
    derived = derived_context_length(spec)
    asked = settings.context_length
    if asked is None or asked <= derived:
        return None
    message = (f"Warning: User-specified context_length ({asked}) is greater than the derived context_length "
               f"({derived}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
               "context_length may differ from max_position_embeddings in the model's config. To allow overriding "
               "this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    return Refusal("SGL001", "ValueError", message, "startup", setting="sglang.context_length",
                   source=archs.ref("configs/model_config.py#L1314"),
                   evidence={"context_length": asked, "derived_context_length": derived})


def own_length_validator(spec: ModelSpec) -> Refusal | None:
    """A config class whose own validator checks the per-layer lists' lengths (Laguna)."""
    n = spec.config.get("num_hidden_layers")
    for key, where in OWN_LENGTH_VALIDATORS.get(archs.serving_arch(spec.raw_config), ()):
        value = spec.config.get(key)
        if isinstance(value, list) and isinstance(n, int) and len(value) != n:
            message = ("Class validation error for validator 'validate_architecture':\n    ValueError: "
                       f"{key} length ({len(value)}) must equal num_hidden_layers ({n}).")
            return Refusal("SGL009", "StrictDataclassClassValidationError", message, "startup",
                           key=spec.config_prefix + key, source=TRANSFORMERS + where,
                           evidence={"num_hidden_layers": n, key: len(value)})
    return None


def per_layer_config_keys(spec: ModelSpec) -> Refusal | None:
    """Gemma-4's config class keys its per-layer table by the full_attention entries of layer_types; an entry
    past num_hidden_layers (an MTP layer appended) is refused before layer_types' own length check. The class
    first types the last entry full_attention whatever it says ("Forcing last layer to `full_attention`",
    configuration_gemma4.py:197-201 in SGLang 0.5.23's transformers 5.19.0), so an appended last entry is a key
    even when typed sliding."""
    types, n = spec.config.get("layer_types"), spec.config.get("num_hidden_layers")
    if (archs.serving_arch(spec.raw_config) not in PER_LAYER_CONFIG_ARCHS or "per_layer_config" in spec.config
            or not isinstance(types, list) or not types or not isinstance(n, int)):
        return None
    last = len(types) - 1
    beyond = [i for i, kind in enumerate(types) if (kind == "full_attention" or i == last) and i >= n]
    if not beyond:
        return None
    message = f"`per_layer_config` keys must be integer layer indices in the range [0, {n}); got {beyond}."
    return Refusal("SGL010", "ValueError", message, "startup", key=spec.config_prefix + "layer_types",
                   source=TRANSFORMERS + "integrations/heterogeneity/configuration_utils.py#L73",
                   evidence={"num_hidden_layers": n, "layer_types": len(types), "keys_out_of_range": beyond})


def layer_types_length(spec: ModelSpec) -> Refusal | None:
    """transformers' `validate_layer_type`, unless SGLang's own config class for the text config's model type
    skips it (the registry's `layer_types_unchecked`, measured in the pinned venv: LFM2's)."""
    types = spec.config.get("layer_types")
    n = spec.config.get("num_hidden_layers")
    if (spec.config.get("model_type") or spec.model_type) == "deepseek_v4" and isinstance(n, int):
        short = hf_config.deepseek_v4_short_list(spec.config, n)
        if short is None:
            return None
        key, length = short
        message = ("Class validation error for validator 'validate_layer_type':\n    ValueError: `num_hidden_layers` "
                   f"({n}) must equal `len({key})` ({length}).")
        return Refusal("SGL002", "StrictDataclassClassValidationError", message, "startup",
                       key=spec.config_prefix + key, source=DSV4_CONFIG_CLASS,
                       evidence={"num_hidden_layers": n, key: length})
    if not isinstance(types, list) or not isinstance(n, int) or len(types) == n:
        return None
    if (spec.config.get("model_type") or spec.model_type) in registry().get("layer_types_unchecked", ()):
        return None
    message = ("Class validation error for validator 'validate_layer_type':\n    ValueError: `num_hidden_layers` "
               f"({n}) must be equal to the number of `layer_types` ({len(types)})")
    return Refusal("SGL002", "StrictDataclassClassValidationError", message, "startup",
                   key=spec.config_prefix + "layer_types", source=TRANSFORMERS_LAYER_TYPES,
                   evidence={"num_hidden_layers": n, "layer_types": len(types)})


def strict_null_window(spec: ModelSpec) -> Refusal | None:
    arch = archs.serving_arch(spec.raw_config)
    sglang_own = arch in archs.STRICT_WINDOW_ARCHS and "sliding_window" in spec.config \
        and spec.config["sliding_window"] is None
    if hf_config.refuses_null_window(arch, spec.config) or sglang_own:
        message = ("Validation error for field 'sliding_window':\n    TypeError: Field 'sliding_window' expected "
                   "int, got NoneType (value: None)")
        return Refusal("SGL005", "StrictDataclassFieldValidationError", message, "startup",
                       key=spec.config_prefix + "sliding_window",
                       source=archs.ref("utils/hf_transformers/config.py#L228"), evidence={"architecture": arch})
    return None


# Text config classes that derive layer_types from `sliding_window_pattern` when config.json has none,
# computing `(i + 1) % sliding_window_pattern` (the pattern is 0 when sliding_window is null).
PATTERN_FALLBACK = {"exaone4": "models/exaone4/configuration_exaone4.py#L106",
                    "exaone4_5_text": "models/exaone4/configuration_exaone4.py#L106"}


def pattern_fallback(spec: ModelSpec) -> Refusal | None:
    """EXAONE-4's config class cannot derive layer_types from a string pattern ("LLLG", as published beside the
    layer_types it writes) or from the 0 it sets for a null window."""
    cfg = spec.config
    model_type = cfg.get("model_type") or spec.model_type
    where = PATTERN_FALLBACK.get(model_type) if isinstance(model_type, str) else None
    if where is None or cfg.get("layer_types") is not None or not cfg.get("num_hidden_layers"):
        return None
    pattern = cfg.get("sliding_window_pattern", 4)
    if cfg.get("sliding_window") is None:
        error, message = "ZeroDivisionError", "integer modulo by zero"
    elif isinstance(pattern, str):
        error, message = "TypeError", "unsupported operand type(s) for %: 'int' and 'str'"
    else:
        return None
    return Refusal("SGL153", error, message, "startup", key=spec.config_prefix + "sliding_window_pattern",
                   source=TRANSFORMERS + where, evidence={"sliding_window_pattern": pattern,
                                                          "sliding_window": cfg.get("sliding_window")})


def layer_types_iterated(spec: ModelSpec) -> Refusal | None:
    """ModelConfig splits SWA / full layer ids from `layer_types` for these classes without checking it is set."""
    if archs.serving_arch(spec.raw_config) not in archs.LAYER_TYPES_ITERATED or spec.config.get("layer_types"):
        return None
    return Refusal("SGL154", "TypeError", "'NoneType' object is not iterable", "startup",
                   key=spec.config_prefix + "layer_types", source=archs.ref("configs/model_config.py#L2766"),
                   evidence={"architecture": archs.serving_arch(spec.raw_config)})


def null_window(spec: ModelSpec) -> Refusal | None:
    arch = archs.serving_arch(spec.raw_config)
    where = archs.WINDOW_MINUS_ONE_SOURCES.get(arch)
    if where is None or "sliding_window" not in spec.config or spec.config["sliding_window"] is not None:
        return None
    file = where.split("#")[0]
    explanation = (f"sliding_window is null, and sglang {archs.TAG.lstrip('v')}'s {arch} computes "
                   f"`config.sliding_window - 1` for its sliding layers while it builds the model ({file}): the "
                   "server stops at model load with TypeError \"unsupported operand type(s) for -: 'NoneType' "
                   "and 'int'\" (SGLang's error, not kvdoctor's; transformers accepts the null)")
    return Refusal("SGL003", "TypeError", "unsupported operand type(s) for -: 'NoneType' and 'int'", "startup",
                   key=spec.config_prefix + "sliding_window", source=archs.ref(where),
                   evidence={"architecture": arch}, explanation=explanation)


def no_swa_layer(spec: ModelSpec, settings: SglangSettings) -> Refusal | None:
    """Hybrid-SWA memory on, but SGLang finds no SWA layer id: its hybrid-SWA pool configurator asserts."""
    decision = swa.decide(spec, settings)
    if not decision.on or decision.swa_layer_ids or set(pools.sglang_kinds(spec).values()) & set(pools.STATE) \
            or archs.serving_arch(spec.raw_config) in archs.DEEPSEEK_V4_ARCHS:
        return None
    return Refusal("SGL012", "AssertionError", "Hybrid SWA model must have at least one SWA layer", "startup",
                   key=spec.config_prefix + ("layer_types" if "layer_types" in spec.config else "sliding_window"),
                   source=archs.ref("model_executor/pool_configurator.py#L668"),
                   evidence={"architecture": archs.serving_arch(spec.raw_config), "swa_layer_ids": []})


def model_class(spec: ModelSpec, release: str = PINS["sglang"]) -> Refusal | None:
    """load_model's architecture resolution (model_loader/utils.py `get_model_architecture`): an architecture
    SGLang has no class for goes to its Transformers backend; with `--model-impl auto` a transformers class
    that is not backend-compatible, or no class and no `auto_map.AutoModel`, stops start-up there
    (`resolve_transformers_arch`). With an AutoModel of the model's own code the outcome depends on that code:
    no prediction."""
    names = [archs.RENAMED.get(a, a) for a in spec.raw_config.get("architectures") or [] if isinstance(a, str)]
    if not names or set(names) & registry(release)["architectures"]:
        return None
    backend = registry().get("transformers_backend", {})
    auto_map = spec.raw_config.get("auto_map")
    auto_map = auto_map if isinstance(auto_map, dict) else {}
    for name in names:  # SGLang checks each listed architecture in turn
        if name in backend.get("compatible", ()):
            continue
        if name in backend.get("incompatible", ()):
            message = (f"{name} has no SGlang implementation and the Transformers implementation is not "
                       "compatible with SGLang.")
            line = 185
        elif "AutoModel" not in auto_map:
            message = (f"Cannot find model module. '{name}' is not a registered model in the Transformers library "
                       "(only relevant if the model is meant to be in Transformers) and 'AutoModel' is not present "
                       "in the model config's 'auto_map' (relevant if the model is custom).")
            line = 155
        else:
            return None
        return Refusal("SGL250", "ValueError", message, "startup", key="architectures",
                       source=archs.ref(f"model_loader/utils.py#L{line}"),
                       evidence={"architecture": name, "sglang_model_class": None,
                                 "transformers_class": name in backend.get("incompatible", ())})
    return None


def exaone_backend(spec: ModelSpec, settings: SglangSettings, release: str) -> Refusal | None:
    """Exaone-4 with sliding layers and no --attention-backend, at a release whose model hook reads the backend
    before the server resolves its default (releases.EXAONE_BACKEND_UNRESOLVED): the hook's assertion stops it."""
    raw = spec.raw_config
    names = raw.get("architectures") or [None]
    if names[0] not in releases.EXAONE_BACKEND_ARCHS or raw.get("sliding_window_pattern", 4) is None:
        return None
    if settings.attention_backend is not None or not at(releases.EXAONE_BACKEND_UNRESOLVED, release):
        return None
    message = (f"One of the attention backends in {releases.EXAONE_BACKENDS} is required for {names[0]}, "
               "but got None")
    source = next(r.source for r in releases.EXAONE_BACKEND_UNRESOLVED if r.holds(release))
    return Refusal("SGL240", "AssertionError", message, "startup", key="sliding_window_pattern", source=source,
                   evidence={"architecture": names[0], "sliding_window_pattern": raw.get("sliding_window_pattern", 4),
                             "release": release})


def heads_attribute_missing(spec: ModelSpec, release: str) -> Refusal | None:
    """A configuration class with no `num_attention_heads` (neither the config nor the class's defaults give it),
    at a release whose ModelConfig reads it as an attribute (releases.HEADS_READ_AS_ATTRIBUTE). Only where the
    installed transformers says the class lacks it: an unknown class predicts nothing."""
    model_type = spec.config.get("model_type") or spec.model_type
    if not at(releases.HEADS_READ_AS_ATTRIBUTE, release) or not isinstance(model_type, str):
        return None
    if "num_attention_heads" in spec.config or "num_attention_heads" in hf_config.attribute_map(model_type):
        return None
    if hf_config.owns(model_type, "num_attention_heads") is not False:
        return None
    class_name = hf_config.class_name(model_type)
    source = next(r.source for r in releases.HEADS_READ_AS_ATTRIBUTE if r.holds(release))
    return Refusal("SGL296", "AttributeError", f"'{class_name}' object has no attribute 'num_attention_heads'",
                   "startup", key=spec.config_prefix + "num_attention_heads", source=source,
                   evidence={"model_type": model_type, "release": release})


def dsa_index_head_dim(spec: ModelSpec) -> Refusal | None:
    """SGLang's DSA token-to-KV pool keeps one 128-wide indexer key per token and asserts the width
    (mem_cache/memory_pool.py:5346 at 0.5.23, :4443 at 0.5.19, :4368 at 0.5.17, a bare assert) when it builds the
    pools, after the configurator sized them (pool_build)."""
    widths = {layer.index_head_dim for layer in spec.layers
              if layer.kind == SPARSE_MLA and layer.index_head_dim is not None} - {128}
    if not widths:
        return None
    width = sorted(widths)[0]
    return Refusal("SGL311", "AssertionError", "", "startup", key=spec.config_prefix + "index_head_dim",
                   source="https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/"
                          "memory_pool.py#L5346", evidence={"index_head_dim": sorted(widths)},
                   explanation=f"index_head_dim is {width}, but SGLang's DSA KV pool stores a 128-wide indexer key and "
                               "asserts `index_head_dim == 128` while building the pools (mem_cache/memory_pool.py), "
                               "a bare assert with no message")


def predict(spec: ModelSpec, settings: SglangSettings) -> tuple[Refusal, ...]:
    """In the order SGLang meets them: config loading, ModelConfig, model load, the pool configurator."""
    release = settings.release or PINS["sglang"]
    # the config-class refusals kvdoctor names specifically first; any other the class raises after them
    found = [config_loader(spec, release), per_layer_config_keys(spec), strict_null_window(spec),
             pattern_fallback(spec), own_length_validator(spec), layer_types_length(spec), config_class_rejects(spec),
             layer_types_iterated(spec), heads_attribute_missing(spec, release), exaone_backend(spec, settings, release),
             dsa_kv_dtype(spec, settings), dsv4_kv_dtype(spec, settings), context_too_long(spec, settings),
             null_window(spec)]
    first = next((r for r in found if r is not None), None)  # start-up stops at the first
    if first is None:
        first = model_class(spec, release) or no_swa_layer(spec, settings)
    return (first,) if first else ()


def pool_build(spec: ModelSpec, settings: SglangSettings) -> tuple[Refusal, ...]:
    """Refusals SGLang meets building the pools, after the sizing (which still stands): a DSA indexer key not 128
    wide (SGL311), and DeepSeek-V4 with hybrid-SWA memory off, which gets no SWA pool size, and its pool adds a page
    to None (releases.DSV4_NO_SWA_SIZE_SINCE)."""
    index = dsa_index_head_dim(spec)
    if index is not None:
        return (index,)
    release = settings.release or PINS["sglang"]
    if archs.serving_arch(spec.raw_config) not in archs.DEEPSEEK_V4_ARCHS or swa.decide(spec, settings).on \
            or release_key(release) < release_key(releases.DSV4_NO_SWA_SIZE_SINCE):
        return ()
    return (Refusal("SGL306", "TypeError", "unsupported operand type(s) for +: 'NoneType' and 'int'", "startup",
                    setting="sglang.disable_hybrid_swa_memory",
                    source=releases.DSV4_NO_SWA_SIZE_SOURCES.get(release, releases.DSV4_NO_SWA_SIZE_SOURCES[PINS["sglang"]]),
                    evidence={"architecture": archs.serving_arch(spec.raw_config), "hybrid_swa": False},
                    explanation="with hybrid-SWA memory off SGLang sizes one token pool and gives DeepSeek-V4's "
                                "sliding-window ring no size; building the DeepSeek-V4 pool then stops start-up"),)
