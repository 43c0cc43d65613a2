"""Start-up refusals SGLang 0.5.23 raises for a config and settings, predicted without running it.

Each carries the exception class and the exact text SGLang (or the transformers config class it loads
the config with) prints, with the numbers filled in, and the pinned source line that raises it.
"""
from __future__ import annotations

from kvdoctor.engines.base import Refusal
from kvdoctor.engines.sglang_cuda import archs
from kvdoctor.engines.sglang_cuda.settings import Settings
from kvdoctor.model import ModelSpec

CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
TRANSFORMERS_LAYER_TYPES = ("https://github.com/huggingface/transformers/blob/v5.20.2/src/transformers/"
                            "configuration_utils.py#L694")


def derived_context_length(spec: ModelSpec) -> int:
    """SGLang's `get_context_length` (utils/hf_transformers/common.py:677): the first context key, times the
    rope-scaling factor unless the scaling states its original length or is llama3-style."""
    cfg = spec.config
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


def context_too_long(spec: ModelSpec, settings: Settings) -> Refusal | None:
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


def layer_types_length(spec: ModelSpec) -> Refusal | None:
    types = spec.config.get("layer_types")
    n = spec.config.get("num_hidden_layers")
    if not isinstance(types, list) or not isinstance(n, int) or len(types) == n:
        return None
    message = ("Class validation error for validator 'validate_layer_type':\n    ValueError: `num_hidden_layers` "
               f"({n}) must be equal to the number of `layer_types` ({len(types)})")
    return Refusal("SGL002", "StrictDataclassClassValidationError", message, "startup",
                   key=spec.config_prefix + "layer_types", source=TRANSFORMERS_LAYER_TYPES,
                   evidence={"num_hidden_layers": n, "layer_types": len(types)})


def strict_null_window(spec: ModelSpec) -> Refusal | None:
    arch = archs.serving_arch(spec.raw_config)
    if arch in archs.STRICT_WINDOW_ARCHS and "sliding_window" in spec.config and spec.config["sliding_window"] is None:
        message = ("Validation error for field 'sliding_window':\n    TypeError: Field 'sliding_window' expected "
                   "int, got NoneType (value: None)")
        return Refusal("SGL005", "StrictDataclassFieldValidationError", message, "startup",
                       key=spec.config_prefix + "sliding_window",
                       source=archs.ref("utils/hf_transformers/config.py#L228"), evidence={"architecture": arch})
    return None


def null_window(spec: ModelSpec) -> Refusal | None:
    arch = archs.serving_arch(spec.raw_config)
    where = archs.WINDOW_MINUS_ONE_SOURCES.get(arch)
    if where is None or "sliding_window" not in spec.config or spec.config["sliding_window"] is not None:
        return None
    return Refusal("SGL003", "TypeError", "unsupported operand type(s) for -: 'NoneType' and 'int'", "startup",
                   key=spec.config_prefix + "sliding_window", source=archs.ref(where),
                   evidence={"architecture": arch})


def predict(spec: ModelSpec, settings: Settings) -> tuple[Refusal, ...]:
    """In the order SGLang meets them: config loading, ModelConfig, model load."""
    found = [strict_null_window(spec), layer_types_length(spec), context_too_long(spec, settings), null_window(spec)]
    return tuple(r for r in found if r is not None)[:1]  # start-up stops at the first
