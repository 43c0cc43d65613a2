"""Hugging Face semantics from transformers' own configuration classes.

For a `model_type` kvdoctor's family table does not cover, the installed transformers' configuration
class (`CONFIG_MAPPING[model_type]`, what `AutoConfig.for_model(model_type, **config)` builds) is the
reference: it derives `layer_types`, applies its defaults and adjusts windows, and its validators refuse
configs that every engine loading the model through transformers would refuse too. Only configuration
classes run (plain Python shipped with transformers): no model code, no network, no file is read.

Cost: transformers' configuration registry imports torch when it can (through
`transformers.modeling_rope_utils`), which configuration classes never need. When torch is not
imported yet, kvdoctor hides it while transformers loads and builds the class (transformers then
runs in its documented "configuration and file utilities only" mode), and restores it after, so
torch stays importable. Figures in docs/model-semantics.md (`bench/semantics.py`): table families
never import transformers.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import msgspec

# Attributes kvdoctor reads from the configuration object once transformers has applied its defaults.
ATTRS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
         "sliding_window", "attention_chunk_size", "layer_types", "use_sliding_window",
         "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim", "index_topk",
         "conv_L_cache", "conv_kernel", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
         "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_d_conv", "ssm_state_size")


class Rejected(Exception):
    """transformers' configuration class raised on this config: `message` is its exact text (the innermost
    error); `outer_class` / `outer_message` the exception as raised, which wraps it for strict-dataclass
    validators (what a caller such as vLLM shows)."""

    def __init__(self, class_name: str, error_class: str, message: str, validator: str | None,
                 outer_class: str | None = None, outer_message: str | None = None):
        super().__init__(message)
        self.class_name, self.error_class, self.message, self.validator = class_name, error_class, message, validator
        self.outer_class = outer_class or error_class
        self.outer_message = outer_message if outer_message is not None else message

    def __reduce__(self):  # results cross process boundaries (parallel checks): keep it picklable
        return Rejected, (self.class_name, self.error_class, self.message, self.validator, self.outer_class,
                          self.outer_message)


class View(msgspec.Struct):
    """What one configuration class made of a config: its class, version and resolved attributes."""

    model_type: str
    class_name: str
    version: str
    resolved: dict[str, Any] = msgspec.field(default_factory=dict)
    # Per-layer attention geometry where the class states one per layer (`per_layer_config`, e.g. Gemma-4's
    # global layers with their own head_dim and key/value heads): layer id -> {attribute: value}.
    per_layer: dict[int, dict[str, int]] = msgspec.field(default_factory=dict)


PER_LAYER_ATTRS = ("head_dim", "num_key_value_heads")


def _per_layer(obj: Any, n: Any) -> dict[int, dict[str, int]]:
    table = getattr(obj, "per_layer_config", None)
    if table is None or not isinstance(n, int):
        return {}
    out: dict[int, dict[str, int]] = {}
    for i in range(n):
        try:
            layer = table[i]
        except Exception:  # a class whose per-layer table does not cover every layer
            continue
        values = {a: getattr(layer, a, None) for a in PER_LAYER_ATTRS}
        out[i] = {a: v for a, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}
    return out


# Architectures whose transformers configuration class declares `sliding_window: int` in a strict dataclass:
# a null is refused while the config loads ("Validation error for field 'sliding_window'"), before any
# engine reaches the model class. Known here even where kvdoctor reads the family itself (no transformers).
STRICT_WINDOW_ARCHS = frozenset({"Gemma4ForConditionalGeneration", "Gemma4ForCausalLM", "MiMoV2FlashForCausalLM",
                                 "LagunaForCausalLM"})


# Mamba hybrids kvdoctor's family table reads itself whose transformers 5.20.2 class has a
# `validate_architecture` (FalconH1Config's "mamba_n_heads must divide mamba_expand * hidden_size", JambaConfig's
# attn_layer_offset below attn_layer_period): vLLM parses config.json with that class, so the plan asks it
# too, and so does SGLang's AutoConfig (SGL155). A test reads the set off the classes.
MAMBA_CLASS_CHECKED = frozenset({"falcon_h1", "bamba", "granitemoehybrid", "jamba", "zamba"})


def refuses_null_window(architecture: str, config: dict[str, Any]) -> bool:
    """Whether transformers' class for `architecture` refuses this config's `sliding_window: null`."""
    return architecture in STRICT_WINDOW_ARCHS and "sliding_window" in config and config["sliding_window"] is None


def deepseek_v4_short_list(config: dict[str, Any], n: int) -> tuple[str, int] | None:
    """DeepseekV4Config cuts `layer_types` (given, else one per legacy `compress_ratios` entry) and `mlp_layer_types`
    to num_hidden_layers in __post_init__ before its own validate_layer_type checks their lengths, so only a list
    shorter than the layers is refused: (the list's name, its length), else None. configuration_deepseek_v4.py
    :211-229, :262, :268 in SGLang 0.5.23's transformers 5.19.0; :214-231, :275, :281 in vLLM 0.34.0's 5.22.2."""
    types = config.get("layer_types")
    if types is None:
        types = config.get("compress_ratios")
    for key, raw in (("layer_types", types), ("mlp_layer_types", config.get("mlp_layer_types"))):
        if isinstance(raw, list) and len(raw) < n:
            return key, len(raw)
    return None


def installed() -> bool:
    return importlib.util.find_spec("transformers") is not None


@contextmanager
def _without_torch() -> Iterator[None]:
    """Hide an unimported torch from transformers (a None entry in sys.modules makes `import torch`
    fail, and transformers then skips its torch-only helpers); leave an imported torch alone."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("torch", False) is None:
            del sys.modules["torch"]


def _registry():
    """(transformers' version, its model_type -> configuration class mapping), imported quietly:
    transformers sets its log level from TRANSFORMERS_VERBOSITY when it first loads."""
    saved = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    try:
        with _without_torch():
            import transformers
            from transformers import CONFIG_MAPPING
    finally:
        if saved is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = saved
    import logging

    # A refusal reaches kvdoctor as the class's exception (Rejected); what transformers logs beside it
    # (`Can't set layer_types with value [] for MambaConfig {...}`, the whole config, dozens of lines)
    # would only repeat it on stderr.
    logging.getLogger("transformers").setLevel(logging.CRITICAL)
    return transformers.__version__, CONFIG_MAPPING


def knows(model_type: str) -> bool:
    """Whether the installed transformers has a configuration class for `model_type` (imports it)."""
    if not installed():
        return False
    _, mapping = _registry()
    return model_type in mapping


def owns(model_type: str, name: str) -> bool | None:
    """Whether the configuration class of `model_type` sets attribute `name` itself (a default instance
    has it); None when transformers or the type is absent, or the class cannot be built bare."""
    if not knows(model_type):
        return None
    _, mapping = _registry()
    try:
        with warnings.catch_warnings(), _without_torch():
            warnings.simplefilter("ignore")
            return name in vars(mapping[model_type]())
    except Exception:  # a class that needs arguments says nothing here
        return None


def class_name(model_type: str) -> str | None:
    """The configuration class's name for `model_type`, None when transformers or the type is absent."""
    if not knows(model_type):
        return None
    _, mapping = _registry()
    with _without_torch():
        return mapping[model_type].__name__


def attribute_map(model_type: str) -> dict[str, str]:
    """The class's own spellings of common keys (GPT-2's `num_hidden_layers` is `n_layer`), read off the
    class without building it: what a config the class refuses still means by them. Empty when absent."""
    if not knows(model_type):
        return {}
    _, mapping = _registry()
    with _without_torch():
        found = getattr(mapping[model_type], "attribute_map", None)
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _innermost(exc: BaseException) -> BaseException:
    """huggingface_hub's strict-dataclass errors wrap the validator's own ValueError."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def read(model_type: str, cfg: dict[str, Any], attrs: tuple[str, ...] = ATTRS) -> View | None:
    """The configuration class's view of `cfg` (the attributes `attrs`, defaults applied), None when
    transformers or the type is absent.

    Raises Rejected when the class's constructor or validators refuse the config."""
    if not installed():
        return None
    version, mapping = _registry()
    if model_type not in mapping:
        return None
    import copy  # only here: the static path never builds the class

    kwargs = {k: v for k, v in copy.deepcopy(cfg).items() if k != "model_type"}
    with _without_torch():
        cls = mapping[model_type]
    try:
        with warnings.catch_warnings(), _without_torch():
            warnings.simplefilter("ignore")
            obj = cls(**kwargs)
    except Exception as exc:  # any refusal of the class is reported, never a traceback
        inner = _innermost(exc)
        validator = getattr(exc, "validator_name", None) or _validator(str(exc))
        raise Rejected(cls.__name__, type(inner).__name__, str(inner).strip(), validator, type(exc).__name__,
                       str(exc)) from None
    resolved = {}
    for name in attrs:
        try:
            value = getattr(obj, name)
        except Exception:  # a property that cannot be computed for this config
            continue
        resolved[name] = list(value) if isinstance(value, tuple) else value
    return View(model_type, cls.__name__, version, resolved, _per_layer(obj, resolved.get("num_hidden_layers")))


def _validator(text: str) -> str | None:
    """The validator named in a strict-dataclass message ("... for validator 'validate_x':")."""
    marker = "validator '"
    if marker not in text:
        return None
    return text.split(marker, 1)[1].split("'", 1)[0]
