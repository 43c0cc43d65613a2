"""The start-up errors vLLM raises from a config and its settings, worded exactly as vLLM words them.

Each builder returns a `Startup` exception carrying the `Refusal` (code, class, exact text, pinned
source; another release's line is `releases.source`). vLLM's config classes are pydantic dataclasses: a
ValueError raised in their validators reaches the user as `pydantic_core.ValidationError` whose text is
"1 validation error for <Class>", then "Value error, <message>" and pydantic's own tail (the input's repr);
`message` is that `<message>` and `evidence["wrapped_in"]` the first line.
"""
from __future__ import annotations

import os

from kvdoctor.engines.budget.common import EngineRefusal
from kvdoctor.engines.base import Refusal
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.vllm.settings import VllmSettings

VERSION = PINS["vllm"]
TRANSFORMERS = "5.20.2"  # the transformers goldens/vllm_check.json ran with (0.33.0 admits <5.21, 0.34.0 <5.23)
SRC = f"https://github.com/vllm-project/vllm/blob/v{VERSION}/vllm/"
HF_SRC = f"https://github.com/huggingface/transformers/blob/v{TRANSFORMERS}/src/transformers/"

CODES = {  # catalog code -> where the pinned vLLM (0.34.0; or the transformers it runs) raises it; MEM codes are the budget's
    # (their catalog entries belong to kvdoctor.checks.budget; the generic refusal rule still reports them)
    "VLM001": HF_SRC + "configuration_utils.py#L706",
    "VLM002": SRC + "config/model.py#L2724",
    "MEM014": SRC + "config/model.py#L1580",
    "MEM002": SRC + "v1/core/kv_cache_planning.py#L854",
    "VLM004": SRC + "v1/core/kv_cache_planning.py#L854",
    "MEM004": SRC + "v1/core/kv_cache_planning.py#L124",
    "VLM006": SRC + "v1/core/kv_cache_planning.py#L107",
    "VLM007": SRC + "model_executor/models/qwen3_next.py#L543",
    "VLM008": SRC + "config/vllm.py#L2206",
    "VLM009": SRC + "model_executor/models/qwen2.py#L249",
    "VLM010": SRC + "v1/core/kv_cache_planning.py#L447",
    "VLM011": SRC + "config/vllm.py#L3574",
    "VLM012": SRC + "config/vllm.py#L3591",
    "VLM032": SRC + "transformers_utils/config.py#L478",
    "VLM370": SRC + "models/deepseek_v4/compressor.py#L327",
    "VLM138": HF_SRC + "models/auto/configuration_auto.py#L430",
    "VLM143": HF_SRC + "dynamic_module_utils.py#L788",
    "VLM142": SRC + "model_executor/models/llama.py#L151",
    "CFG023": SRC + "model_executor/layers/rotary_embedding/__init__.py#L350",
    "VLM151": SRC + "transformers_utils/config.py#L1309",
    "VLM152": SRC + "v1/kv_cache_interface.py#L164",  # replace_as; raises only at 0.32-0.33 (releases._LINES)
    # raised only up to 0.31.0 (while `afmoe` is in vLLM's own config registry); the last release that raises it that kvdoctor has read
    "VLM291": "https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/model_executor/models/afmoe.py#L192",
    # raised by transformers 5.18.0 when 0.26.0-0.27.1 read Gemma-4's global head_dim (releases.GEMMA4_GLOBAL_HEAD_DIM)
    "VLM250": "https://github.com/huggingface/transformers/blob/v5.18.0/src/transformers/integrations/heterogeneity/"
              "configuration_utils.py#L298",
    "VLM139": SRC + "model_executor/models/registry.py#L1328",
    "VLM290": "https://github.com/vllm-project/vllm/blob/v0.26.0/vllm/model_executor/models/qwen3_5.py#L636",
    "VLM140": SRC + "model_executor/models/registry.py#L1313",
    "VLM141": SRC + "model_executor/models/registry.py#L1322",
    "VLM209": SRC + "model_executor/models/config.py#L1103",
    "VLM261": SRC + "model_executor/layers/mamba/mamba_mixer2.py#L318",
}


class Startup(Exception):
    """vLLM would stop here; carries the refusal."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.message)
        self.refusal = refusal


def refusal(code: str, error_class: str, message: str, key: str | None = None, layer: int | None = None,
            **evidence: object) -> Startup:
    """`key`: a config.json key, or a `vllm:` setting (then the finding points at the deploy file's line)."""
    setting = f"vllm.{key}" if key in VllmSettings.model_fields else None
    return Startup(Refusal(code=code, error_class=error_class, message=message, stage="startup", layer=layer,
                           key=None if setting else key, setting=setting, source=CODES[code], evidence=evidence))


def layer_types_length(layers: int, types: int) -> Startup:
    """transformers' PreTrainedConfig.validate_layer_type, run while vLLM loads the config."""
    inner = f"`num_hidden_layers` ({layers}) must be equal to the number of `layer_types` ({types})"
    return refusal("VLM001", "StrictDataclassClassValidationError",
                   f"Class validation error for validator 'validate_layer_type':\n    ValueError: {inner}",
                   key="layer_types", num_hidden_layers=layers, layer_types=types)


def layer_types_length_own_class(layers: int, types: int) -> Startup:
    """The same check where the release reads the config with its own class (releases.QWEN3_5_OWN_CONFIG): the
    venv transformers' plain ValueError, wrapped by ModelConfig."""
    return refusal("VLM001", "ValidationError",
                   f"`num_hidden_layers` ({layers}) must be equal to the number of `layer_types` ({types})",
                   key="layer_types", wrapped_in="1 validation error for ModelConfig", num_hidden_layers=layers,
                   layer_types=types)


def deepseek_v4_list_length(layers: int, key: str, entries: int) -> Startup:
    """DeepseekV4Config's own validate_layer_type (configuration_deepseek_v4.py:214-231 in vLLM 0.34.0's
    transformers 5.22.2), which replaces the generic one: its own wording, for `layer_types` and `mlp_layer_types`."""
    inner = f"`num_hidden_layers` ({layers}) must equal `len({key})` ({entries})."
    return refusal("VLM001", "StrictDataclassClassValidationError",
                   f"Class validation error for validator 'validate_layer_type':\n    ValueError: {inner}",
                   key=key, num_hidden_layers=layers, **{key: entries})


def dsv4_compressor_head(key: str, head: int) -> Startup:
    """DeepseekCompressor's fused quant+cache layout, chosen while the model class is built (compressor.py:310-329
    @ 0.34.0): a head of neither 512 nor 128 has none."""
    return refusal("VLM370", "ValueError", f"Unsupported head_dim for fused quant+cache: {head}", key=key, head_dim=head)


def unrecognized_model_type(model_type: str) -> Startup:
    """AutoConfig.from_pretrained for a model_type neither transformers (as vLLM 0.33.0 admits it) nor
    vLLM's own config registry knows; ModelConfig's pydantic wrapper makes it a ValidationError."""
    message = (f"The checkpoint you are trying to load has model type `{model_type}` but Transformers does not "
               "recognize this architecture. This could be because of an issue with the checkpoint, or because "
               "your version of Transformers is out of date.\n\nYou can update Transformers with the command "
               "`pip install --upgrade transformers`. If this does not work, and the checkpoint is very new, then "
               "there may not be a release version that supports this model yet. In this case, you can get the "
               "most up-to-date code by installing Transformers from source with the command "
               "`pip install git+https://github.com/huggingface/transformers.git`")
    return refusal("VLM138", "ValidationError", message, key="model_type",
                   wrapped_in="1 validation error for ModelConfig", transformers=TRANSFORMERS)


def remote_code_not_trusted(model_dir: str, upstream: str | None = None) -> Startup:
    """transformers' resolve_trust_remote_code (dynamic_module_utils.py), which AutoConfig runs for an
    auto_map class when vLLM passes trust_remote_code=False; the message names the model directory as
    vLLM was given it, twice as a path and once as a Hub address. An auto_map class given as "repo--module.Class"
    (EXAONE-3.0's) names an upstream repository, which AutoConfig passes where resolve_trust_remote_code takes its
    `error_message` (configuration_auto.py), so the message starts with that repository instead."""
    if upstream is not None:
        head = f"{upstream} You can inspect the repository content at https://hf.co/{model_dir}.\n"
    else:
        head = (f"The repository {model_dir} contains custom code which must be executed to correctly load the "
                f"model. You can inspect the repository content at {os.path.abspath(model_dir)} .\n You can "
                f"inspect the repository content at https://hf.co/{model_dir}.\n")
    message = head + "Please pass the argument `trust_remote_code=True` to allow custom code to be run."
    return refusal("VLM143", "ValidationError", message, key="trust_remote_code",
                   wrapped_in="1 validation error for ModelConfig")


def unsupported_architecture(names: list[str], registered: list[str], dropped: dict[str, str],
                             moved: dict[str, str]) -> Startup:
    """`_ModelRegistry._raise_for_unsupported` (ModelConfig's pydantic wrapper makes it a ValidationError):
    an architecture vLLM dropped or moved to a plugin is named as such, otherwise every registered one
    is listed, in the registry's order, as a printed `dict_keys`."""
    for name in names:
        if name in dropped:
            return refusal("VLM140", "ValidationError",
                           f"Model architecture {name} was supported in vLLM until v{dropped[name]}, and is not "
                           "supported anymore. Please use an older version of vLLM if you want to use this model "
                           "architecture.", key="architectures", architecture=name,
                           wrapped_in="1 validation error for ModelConfig")
        if name in moved:
            return refusal("VLM141", "ValidationError",
                           f"Model architecture {name} is not supported in-tree anymore. Please install the plugin "
                           f"at {moved[name]} if you want to use this model architecture.",
                           key="architectures", architecture=name, plugin=moved[name],
                           wrapped_in="1 validation error for ModelConfig")
    return refusal("VLM139", "ValidationError",
                   f"Model architectures {names} are not supported for now. Supported architectures: "
                   f"dict_keys({registered})", key="architectures", architectures=names,
                   wrapped_in="1 validation error for ModelConfig")


def gemma4_global_head_dim() -> Startup:
    """vLLM up to 0.27.1 sizes Gemma-4's heads from the text config's `head_dim`, which transformers' heterogeneous
    Gemma-4 config holds per layer and will not give globally (releases.GEMMA4_GLOBAL_HEAD_DIM)."""
    message = ("'head_dim' is a per-layer attribute and may vary across layers. Access it via the individual layer "
               "configs instead (e.g. config.per_layer_config[i].head_dim). To read the global config value from "
               "config.head_dim anyway, set `allow_global_per_layer_attribute_access` to `True` on the config. "
               "Warning: only do this if the caller can safely handle heterogeneous configs; code that assumes a "
               "homogeneous model may use the global value incorrectly.")
    return refusal("VLM250", "AmbiguousGlobalPerLayerAttributeError", message, key="head_dim")


def vision_config_missing(config_class: str) -> Startup:
    """A text-only config whose architecture vLLM reaches only by swapping its suffix for a multimodal class, which
    builds its vision tower from `config.vision_config` (specs.VISION_TOWER_CLASSES)."""
    return refusal("VLM290", "AttributeError", f"'{config_class}' object has no attribute 'vision_config'",
                   key="architectures")


def afmoe_layer_types_unset() -> Startup:
    """vLLM up to 0.31.0 reads an AFMoE config without `layer_types` with its own AfmoeConfig (its _CONFIG_REGISTRY;
    transformers_utils/configs/afmoe.py:77 @ 0.30.0), which leaves it None, and the model class indexes it per layer
    while built. From 0.32.0 transformers' AfmoeConfig reads it and derives the list from
    `global_attn_every_n_layers`."""
    return refusal("VLM291", "TypeError", "'NoneType' object is not subscriptable", key="layer_types")


def config_class_rejects(rejected) -> Startup:
    """A model type outside kvdoctor's table whose transformers configuration class refuses the config
    (kvdoctor.load.hf_config.Rejected): vLLM builds that class while reading config.json and stops with its
    error, as raised (strict-dataclass validators wrap the validator's own error)."""
    key = "layer_types" if "layer_types" in rejected.message else (
        "sliding_window" if "sliding_window" in rejected.message else None)
    if rejected.outer_class == "ValueError":
        # vLLM reads config.json in ModelConfig.__post_init__ (config/model.py), and ModelConfig is a pydantic
        # dataclass: pydantic turns a ValueError raised there into a ValidationError ("1 validation error for
        # ModelConfig / Value error, ..."); other exceptions (TypeError, the strict-dataclass errors) pass as raised
        return refusal("VLM032", "ValidationError", rejected.outer_message.strip(), key=key,
                       wrapped_in="1 validation error for ModelConfig", config_class=rejected.class_name,
                       validator=rejected.validator, inner=f"{rejected.error_class}: {rejected.message}")
    return refusal("VLM032", rejected.outer_class, rejected.outer_message.strip(), key=key,
                   config_class=rejected.class_name, validator=rejected.validator,
                   inner=f"{rejected.error_class}: {rejected.message}")


def strict_null_window() -> Startup:
    """`sliding_window: null` where transformers' class for the model is a strict dataclass (kvdoctor.load.
    hf_config.STRICT_WINDOW_ARCHS): vLLM's config parse stops with the class's error, as raised. The same
    error `config_class_rejects` reports where kvdoctor ran the class itself."""
    return refusal("VLM032", "StrictDataclassFieldValidationError",
                   "Validation error for field 'sliding_window':\n    TypeError: Field 'sliding_window' expected int, "
                   "got NoneType (value: None)", key="sliding_window")


def max_model_len_over(requested: int, key: str, derived: float, model_max_length: int | None) -> Startup:
    message = (f"User-specified max_model_len ({requested}) is greater than the derived max_model_len ({key}="
               f"{derived} or model_max_length={model_max_length} in model's config.json). To allow overriding "
               "this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must "
               "be used with extreme caution. If the model uses relative position encoding (RoPE), positions "
               "exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
               "exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.")
    return refusal("VLM002", "ValidationError", message, key="max_model_len",
                   wrapped_in="1 validation error for ModelConfig", max_model_len=requested, derived=derived)


def kv_heads_split(heads: int, tp: int, layer: int) -> Startup:
    """A bare `assert` in the attention classes of llama.py (which Mistral and Phi-3 reuse) and 58 more
    model files, so the message is empty; a class without one fails the same way in QKVParallelLinear's
    `divide` ("10 is not divisible by 8")."""
    return refusal("VLM142", "AssertionError", "", key="tensor_parallel_size", layer=layer,
                   num_key_value_heads=heads, tensor_parallel_size=tp)


def rope_type_unknown(rope_type: object, key: str) -> Startup:
    """get_rope, called by the model class's attention while vLLM builds the model, knows a fixed set of
    scaling types; any other stops it (GPT-J's published `rope_scaling: {"rope_type": "gptj"}`)."""
    return refusal("CFG023", "ValueError", f"Unknown RoPE scaling type {rope_type}", key=key, rope_type=rope_type)


def text_config_not_a_config(model_type: str) -> Startup:
    """get_hf_text_config: the class config.json's top-level model_type names has no text sub-config, so it
    keeps `text_config` as the plain dict it was given, which get_text_config returns; ModelConfig is a
    pydantic dataclass, so the ValueError reaches the user as a ValidationError."""
    return refusal("VLM151", "ValidationError",
                   "The text_config extracted from the model config does not have `num_attention_heads` attribute. "
                   "This indicates a mismatch between the model config and vLLM's expectations. Please ensure that "
                   "the model config is compatible with vLLM.", key="model_type",
                   wrapped_in="1 validation error for ModelConfig", model_type=model_type)


def vision_heads_split(heads: int, tp: int) -> Startup:
    """The vision tower's attention splits its heads over the TP ranks with `divide` (glm4_1v.py
    Glm4vVisionAttention), which asserts with this text while the model is built."""
    return refusal("VLM142", "AssertionError", f"{heads} is not divisible by {tp}", key="tensor_parallel_size",
                   vision_num_heads=heads, tensor_parallel_size=tp)


def sliding_mla_promotion() -> Startup:
    """HMA off promotes each SlidingWindowMLASpec to an MLAAttentionSpec when full MLA layers exist
    (kv_cache_planning.py _promote_local_kv_cache_specs); `replace_as` carries the sliding spec's
    `bounded_replay` field over, which MLAAttentionSpec does not take (DeepSeek-V4's compressed layers)."""
    return refusal("VLM152", "TypeError",
                   "MLAAttentionSpec.__init__() got an unexpected keyword argument 'bounded_replay'",
                   key="disable_hybrid_kv_cache_manager")


def tp_heads(heads: int, tp: int) -> Startup:
    return refusal("MEM014", "ValidationError",
                   f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}).",
                   key="tensor_parallel_size", wrapped_in="1 validation error for VllmConfig",
                   num_attention_heads=heads, tensor_parallel_size=tp)


def unknown_layer_type(kind: str | None, layer: int) -> Startup:
    return refusal("VLM007", "ValueError", f"Invalid layer_type {kind}", key="layer_types", layer=layer)


def hma_forced_on() -> Startup:
    return refusal("VLM008", "ValidationError",
                   "Hybrid KV cache manager was explicitly enabled but is not supported in this configuration. "
                   "Consider omitting the --enable-hybrid-kv-cache-manager flag to let vLLM decide automatically.",
                   key="disable_hybrid_kv_cache_manager", wrapped_in="1 validation error for VllmConfig")


def nvfp4_with_mla() -> Startup:
    return refusal("VLM011", "ValidationError",
                   "nvfp4 KV cache is not supported with MLA (Multi-head Latent Attention) backends. Please use a "
                   "different --kv-cache-dtype (e.g., 'fp8', 'auto', or 'nvfp4_ds_mla' with a sparse MLA backend) "
                   "for MLA models such as DeepSeek.", key="kv_cache_dtype",
                   wrapped_in="1 validation error for VllmConfig")


def mamba_block_without_prefix_caching() -> Startup:
    return refusal("VLM012", "ValidationError", "--mamba-block-size can only be set with --enable-prefix-caching",
                   key="mamba_block_size", wrapped_in="1 validation error for VllmConfig")


def chunked_prefill_for_mamba_caching(message: str) -> Startup:
    """MambaModelConfig's assertion while VllmConfig validates (pydantic words it "Assertion failed, ...")."""
    return refusal("VLM209", "ValidationError", message, key="enable_chunked_prefill",
                   wrapped_in="1 validation error for VllmConfig")


def mamba2_groups_split(groups: int, tp: int, key: str) -> Startup:
    """MambaMixer2's assertion while the model is built: its B/C groups are split over the TP ranks."""
    return refusal("VLM261", "AssertionError",
                   "If tensor parallel world size does not divide num_groups, then num_groups must equal 1.",
                   key=key, n_groups=groups, tensor_parallel_size=tp)


def qwen2_window_layers(max_window_layers, layers: int) -> Startup:
    return refusal("VLM009", "AssertionError",
                   "Sliding window for some but all layers is not supported. This model uses sliding window but "
                   f"`max_window_layers` = {max_window_layers} is less than `num_hidden_layers` = {layers}. Please "
                   "open an issue to discuss this feature.", key="max_window_layers")


# kvdoctor.engines.vllm.budget raises these with vLLM's text; the profile files them under their codes.
# (vLLM 0.26.0 words the promotion failure "... failed to convert the KV cache specs to one unified type.":
# kvdoctor.engines.vllm.releases.PROMOTION_FAILED)
BUDGET_CODES = (("Failed to promote local KV cache specs", "MEM002"), ("failed to convert the KV cache specs", "MEM002"),
                ("To serve at least one request", "MEM004"),
                ("No available memory for the cache blocks", "VLM006"), ("cannot be padded", "VLM010"))
KEYS = {"MEM002": "disable_hybrid_kv_cache_manager", "VLM004": "disable_hybrid_kv_cache_manager",
        "MEM004": "max_model_len", "VLM006": "kv_budget"}


def from_budget(error: EngineRefusal, has_state: bool) -> Startup:
    """`has_state`: some layer keeps a Mamba-style state (MEM002 explains that promotion failure; VLM004
    the one where local layers of two kinds meet without a full-attention layer to promote them to)."""
    code = next(c for text, c in BUDGET_CODES if text in error.message)
    if code == "MEM002" and not has_state:
        code = "VLM004"
    return refusal(code, error.cls, error.message, key=KEYS.get(code))
