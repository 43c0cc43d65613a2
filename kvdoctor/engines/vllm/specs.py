"""Which KV cache spec vLLM 0.33.0's model class gives each layer, read from config.json as vLLM reads it.

vLLM does not read kvdoctor's (Hugging Face) meaning of a layer; each model class decides from the
transformers config object:
- `layer_types`: the list transformers holds (the config's own, or the one its config class derives);
  transformers refuses a list whose length is not `num_hidden_layers`.
- The model-level window `CacheConfig.sliding_window` is `sliding_window` only when there is no
  `layer_types` or every entry is `sliding_attention` (engine/arg_utils.py), and `Attention` falls
  back to it for a layer its class gave no window of its own (layers/attention/attention.py).
- Per class: Llama / Mistral / Phi-3 / Gemma 2 / Gemma 3 / the Transformers backend (Olmo 3) give a
  `sliding_attention` entry the window; Qwen2 gives none (model-level window only, and asserts
  `max_window_layers == num_hidden_layers` when the types are mixed); gpt-oss slides the even layers
  whatever `layer_types` says; DeepSeek-V3 and Kimi-Linear's attention is MLA (no window);
  Llama 4 uses chunked local attention on its RoPE layers; Qwen3-Next and Kimi-Linear build a Mamba
  state for their linear-attention layers.
Checked against goldens/vllm_check.json (vLLM's own get_kv_cache_spec on the meta device).
"""
from __future__ import annotations

from typing import Any

import msgspec

from kvdoctor.engines.releases import at
from kvdoctor.engines.vllm import registry, releases
from kvdoctor.engines.vllm.refusals import (config_class_rejects, deepseek_v4_list_length, layer_types_length,
                                            qwen2_window_layers, unknown_layer_type)
from kvdoctor.load import hf_config
from kvdoctor.model import FULL as FULL_KIND
from kvdoctor.model import MAMBA as MAMBA_KIND
from kvdoctor.model import GDN, ModelSpec, Source

FULL = "FullAttentionSpec"
SLIDING = "SlidingWindowSpec"
CHUNKED = "ChunkedLocalAttentionSpec"
MLA = "MLAAttentionSpec"
MAMBA = "MambaSpec"

# Resolved architecture -> how its model class picks a layer's attention.
RULES = {
    "LlamaForCausalLM": "layer_types", "MistralForCausalLM": "layer_types", "Phi3ForCausalLM": "layer_types",
    "Gemma2ForCausalLM": "layer_types", "Gemma3ForCausalLM": "layer_types", "Olmo3ForCausalLM": "layer_types",
    "Qwen2ForCausalLM": "model_window", "GptOssForCausalLM": "even_layers",
    "DeepseekV3ForCausalLM": "mla", "DeepseekV2ForCausalLM": "mla",
    "KimiLinearForCausalLM": "kimi_linear", "Qwen3NextForCausalLM": "qwen3_next",
    "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4",
    # qwen3_5.py raises the same "Invalid layer_type" for anything but linear / full attention
    "Qwen3_5ForCausalLM": "qwen3_next", "Qwen3_5MoeForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_next", "Qwen3_5MoeForConditionalGeneration": "qwen3_next",
    # nemotron_h.py: a Mamba-2 mixer ("M"), attention ("*", model-level window only) or no mixer (MLP "-",
    # MoE "E": no KV cache spec at all), per hybrid_override_pattern / layers_block_type
    "NemotronHForCausalLM": "nemotron_h",
    # lfm2.py: attention where layer_types says full_attention, a short convolution (MambaSpec) elsewhere
    "Lfm2ForCausalLM": "lfm2", "Lfm2VlForConditionalGeneration": "lfm2",
    # mimo_v2.py: sliding where hybrid_layer_pattern[i] == 1, with sliding_window_size as its window (not
    # the config class's sliding_window, which transformers sets one larger); the others plain full
    "MiMoV2FlashForCausalLM": "mimo_v2",
    # jamba.py: a Mamba-1 mixer or attention per layers_block_type (attn_layer_period / attn_layer_offset)
    "JambaForCausalLM": "jamba",
    # kimi_k3.py builds Kimi-Linear's text model: KDA state on linear_attn_config.kda_layers, MLA elsewhere
    "KimiK3ForConditionalGeneration": "kimi_linear",
    # falcon_h1.py: every decoder layer runs attention and a Mamba-2 mixer side by side; the attention's spec keeps
    # the layer's index i, the mixer's is registered as layer num_hidden_layers + i ("In V1 all attention/ssm layers
    # must have different index in prefix"), so the model has two specs per layer
    "FalconH1ForCausalLM": "falcon_h1",
    # zamba2.py: each shared attention block builds one Attention per hybrid layer it serves, named model.attn.j
    # (j below the hybrid count, Zamba2Config.hybrid_layer_ids), and every decoder layer a Mamba-2 mixer registered as
    # layer hybrid count + i ("avoid layers getting same index"): hybrid count + layers specs
    "Zamba2ForCausalLM": "zamba2",
    # minicpm3.py up-projects its latent into per-head keys and values and caches those: a plain Attention of
    # num_attention_heads KV heads of qk_nope_head_dim + qk_rope_head_dim (not MLA, whatever kv_lora_rank says)
    "MiniCPM3ForCausalLM": "expanded_mla",
    # falcon.py builds its Attention without the cache config (the only text model class of 0.34.0 that does): no
    # layer gets CacheConfig.sliding_window, and the KV cache keeps the model dtype whatever kv_cache_dtype says
    "FalconForCausalLM": "no_cache_config",
    # the attention-free classes: a Mamba-2 mixer (mamba2.py) or a Mamba-1 mixer (mamba.py, which vLLM's registry also
    # serves FalconMambaForCausalLM with) on every layer, each one MambaSpec
    "Mamba2ForCausalLM": "mamba2", "MambaForCausalLM": "mamba1", "FalconMambaForCausalLM": "mamba1",
}
# Model classes the table leaves to `--dry-run` whatever their layers look like (goldens/vllm_check.json
# holds what vLLM 0.33.0 does with them): why, in a few words.
NOT_PLANNED = {
    "DeepseekV4ForCausalLM": "vLLM's model class gives each layer a SlidingWindowMLASpec plus MLA specs for "
                             "its key compressors (167 specs for DeepSeek-V4-Flash's 43 layers), which kvdoctor "
                             "plans from vLLM 0.30.0 on (engines/vllm/dsv4.py)",
    "DeciLMForCausalLM": "its config class ships with the model (auto_map), which vLLM runs only with "
                         "trust_remote_code",
}
DSV4 = "DeepseekV4ForCausalLM"


def not_planned(arch: str, release: str) -> str | None:
    """Why the profile leaves this class to `--dry-run` at this release (NOT_PLANNED), None where it plans it:
    DeepSeek-V4 from the releases engines/vllm/dsv4.py was checked against (releases.DSV4_PLANNED)."""
    if arch == DSV4 and at(releases.DSV4_PLANNED, release):
        return None
    return NOT_PLANNED.get(arch)


# The config.json key of a Mamba-2 mixer's B/C group count, per model class: MambaMixer2 asserts that the TP size
# divides it unless it is 1 (VLM261); checked only where config.json gives it
MAMBA2_GROUPS_KEY = {"NemotronHForCausalLM": "n_groups", "FalconH1ForCausalLM": "mamba_n_groups",
                     "Mamba2ForCausalLM": "n_groups", "Zamba2ForCausalLM": "mamba_ngroups",
                     "GraniteMoeHybridForCausalLM": "mamba_n_groups"}
# Architectures beside load.hf_config.STRICT_WINDOW_ARCHS whose transformers 5.20.2 class (the one vLLM
# loads) refuses `sliding_window: null` as a strict int field (goldens: DeepSeek-V4-Flash and -Pro)
STRICT_WINDOW_VLLM = {"DeepseekV4ForCausalLM"}
# model_type -> transformers derives `layer_types` when config.json has none (configuration_*.py, 5.20).
DERIVES_LAYER_TYPES = {"qwen2", "gemma2", "gemma3", "gemma3_text", "gpt_oss", "olmo3", "qwen3_next",
                       "kimi_linear", "llama4", "llama4_text", "cohere2", "exaone4", "exaone4_5_text"}
# the Qwen3.5 types vLLM reads with its own classes up to 0.31.0 (releases.QWEN3_5_OWN_CONFIG)
QWEN3_5_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
QWEN3_NEXT_TYPES = ("linear_attention", "full_attention")
# model_type -> its transformers 5.20.2 config class sets sliding_window to None (qwen2_moe: 0) unless
# use_sliding_window is true; a test reads the list off the classes. qwen2_vl / qwen2_5_vl: a config.json
# of that type builds its text config (one of the listed) from its top-level text keys. (SmolLM3's class
# keeps the window and reads the flag only when it derives layer_types.)
WINDOW_NEEDS_FLAG = {"deepseek_ocr2_encoder", "inkling_text", "modernbert", "qwen2", "qwen2_5_omni_talker",
                     "qwen2_5_omni_text", "qwen2_5_vl_text", "qwen2_moe", "qwen2_vl_text", "qwen3", "qwen3_moe",
                     "recurrent_gemma", "qwen2_vl", "qwen2_5_vl"}
# model classes vLLM marks IsHybrid (Mamba-style state)
HYBRID = {"Qwen3NextForCausalLM", "KimiLinearForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
          "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "NemotronHForCausalLM",
          "Lfm2ForCausalLM", "Lfm2VlForConditionalGeneration", "JambaForCausalLM",
          "KimiK3ForConditionalGeneration", "FalconH1ForCausalLM", "Zamba2ForCausalLM"}
# model classes whose MambaModelConfig hook runs at vLLM's config stage (model_executor/models/config.py @ 0.34.0:
# MODELS_CONFIG_MAP's attention-free Mamba classes, and every IsHybrid class): with prefix caching on, it asserts
# chunked prefill
# the IsAttentionFree classes above: vLLM leaves their prefix caching off unless it is asked for
ATTENTION_FREE = {"Mamba2ForCausalLM", "MambaForCausalLM", "FalconMambaForCausalLM"}
MAMBA_CONFIG_HOOK = HYBRID | {"GraniteMoeHybridForCausalLM", "OlmoHybridForCausalLM",
                              "Lfm2MoeForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM", "FalconMambaForCausalLM"}


class LayerSpecPlan(msgspec.Struct, frozen=True):
    index: int
    spec: str  # the vLLM spec class, named as vLLM names it
    window: int | None = None  # sliding window (keys including the query's own)
    chunk: int | None = None  # attention_chunk_size of a chunked local layer


class Interpretation(msgspec.Struct, frozen=True):
    architecture: str
    rule: str
    layer_types: tuple[str, ...] | None  # what transformers holds
    sliding_window: int | None  # the text config's window as transformers holds it
    model_window: int | None  # CacheConfig.sliding_window
    layers: tuple[LayerSpecPlan, ...]  # the layers vLLM builds a KV cache spec for, in layer order


def architecture(spec: ModelSpec) -> str:
    archs = spec.raw_config.get("architectures") or []
    return str(archs[0]) if archs else ""


def _transformers_window(spec: ModelSpec) -> int | None:
    cfg = spec.config
    window = cfg.get("sliding_window")
    if spec.model_type in WINDOW_NEEDS_FLAG and not cfg.get("use_sliding_window", False):
        return None  # these config classes keep the window only with use_sliding_window
    return window if isinstance(window, int) and window > 0 else None


def _transformers_layer_types(spec: ModelSpec) -> list[str] | None:
    raw = spec.config.get("layer_types")
    if isinstance(raw, list) and spec.semantics == "transformers" and len(raw) == len(spec.layers):
        # the list as the configuration class holds it, which may edit config.json's (Gemma4TextConfig
        # forces the last layer to full_attention): its layers were built from that list
        attention = ("full_attention", "sliding_attention")
        return [_hf_kind(layer.kind) if str(t) in attention and layer.kind in attention else str(t)
                for t, layer in zip(raw, spec.layers)]
    if isinstance(raw, list):
        return [str(t) for t in raw]
    if spec.model_type.startswith("qwen3_5"):  # Qwen3_5(Moe)TextConfig: every full_attention_interval-th is full
        interval = spec.config.get("full_attention_interval") or 4
        return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(spec.num_hidden_layers)]
    if spec.model_type == "lfm2":  # Lfm2Config: full attention at full_attn_idxs (default: every layer)
        idxs = spec.config.get("full_attn_idxs")
        full = set(idxs) if isinstance(idxs, list) else set(range(spec.num_hidden_layers))
        return ["full_attention" if i in full else "conv" for i in range(spec.num_hidden_layers)]
    if spec.model_type in ("llama4", "llama4_text"):  # Llama4TextConfig: from no_rope_layers, window or not
        return ["chunked_attention" if rope else "full_attention" for rope in _llama4_rope_layers(spec)]
    if spec.model_type in DERIVES_LAYER_TYPES:
        return [_hf_kind(layer.kind) for layer in spec.layers]
    derived = spec.defaults.get("layer_types") if spec.semantics == "transformers" else None
    if isinstance(derived, list):  # a type outside the table: the list its config class derived
        return [str(t) for t in derived]
    return None


def _hf_kind(kind: str) -> str:
    """kvdoctor's layer kind -> the `layer_types` entry transformers derives for it."""
    return {"sliding_attention": "sliding_attention", "chunked_attention": "chunked_attention",
            "gated_deltanet": "linear_attention", "kda": "linear_attention"}.get(kind, "full_attention")


# model_type -> the transformers configuration class that builds it, for a text model type a composite
# config renames (Exaone4_5_Config: exaone4_5_text -> exaone4)
CONFIG_CLASS_TYPE = {"exaone4_5_text": "exaone4"}
# Table types whose configuration class computes `layer_types` itself, with arithmetic on a config key
# that can fail, when config.json has none: Exaone4Config takes `(i + 1) % sliding_window_pattern`, which
# a pattern string ("LLLG") makes a TypeError and a null sliding_window (pattern 0) a ZeroDivisionError.
DERIVATION_CAN_FAIL = {"exaone4", "exaone4_5_text"}
# Types whose transformers 5.20.2 configuration class answers `layer_types` with a read-only property (Jamba's
# from attn_layer_period, Falcon-H1's through attribute_map to layers_block_type, ...): a config.json that
# sets it stops in the class ("property 'layer_types' of 'JambaConfig' object has no setter"). A test reads
# the set off the classes.
LAYER_TYPES_READ_ONLY = {"bamba", "falcon_h1", "falcon_mamba", "jamba", "mamba", "mamba2"}


def check_layer_types(spec: ModelSpec) -> None:
    """transformers' checks while vLLM reads config.json: one `layer_types` entry per layer, and the
    derivation of the list where a configuration class that can fail at it derives it."""
    if spec.model_type == "deepseek_v4":  # its own class: lists cut to the layers, then its own length check
        short = hf_config.deepseek_v4_short_list(spec.config, spec.num_hidden_layers)
        if short:
            raise deepseek_v4_list_length(spec.num_hidden_layers, *short)
        return
    if spec.model_type in DERIVATION_CAN_FAIL and "layer_types" not in spec.config:
        _config_class_check(spec)
    if spec.model_type in hf_config.MAMBA_CLASS_CHECKED or (spec.model_type in LAYER_TYPES_READ_ONLY and "layer_types" in spec.config):
        _config_class_check(spec)
    types = _transformers_layer_types(spec)
    if types is not None and len(types) != spec.num_hidden_layers:
        raise layer_types_length(spec.num_hidden_layers, len(types))


def as_release_reads(spec: ModelSpec, release: str) -> ModelSpec | None:
    """Qwen3-Next without `layer_types` as the release's own Qwen3NextConfig lays it out (up to 0.31.0: full
    attention on every fourth layer whatever `full_attention_interval` says: transformers_utils/configs/qwen3_next.py
    :249-254, the same lines in the 0.26.0, 0.29.0 and 0.31.0 wheels; from 0.32.0 transformers' class reads the
    interval); any
    other spec as it is. None where that layout needs a layer kind the config has none of to copy the geometry from."""
    if spec.model_type != "qwen3_next" or "layer_types" in spec.config or not registry.reads_with_own_class(
            spec.model_type, release):
        return spec
    kinds = [GDN if (i + 1) % 4 else FULL_KIND for i in range(spec.num_hidden_layers)]
    if kinds == [l.kind for l in spec.layers]:
        return spec
    model = {l.kind: l for l in reversed(spec.layers)}  # the first layer of each kind
    if GDN not in model or FULL_KIND not in model:
        return None
    source = Source("derived", f"vLLM {release}'s own Qwen3NextConfig: full attention on every fourth layer")
    return msgspec.structs.replace(spec, layers=[
        msgspec.structs.replace(model[kind], index=i, sources={**model[kind].sources, "kind": source})
        for i, kind in enumerate(kinds)])


def interpret(spec: ModelSpec) -> Interpretation:
    """vLLM's per-layer spec classes and windows; raises Startup for what vLLM refuses on the way."""
    arch = architecture(spec)
    n = spec.num_hidden_layers
    types = _transformers_layer_types(spec)
    rule = rule_for(spec, arch, types)
    if rule == "nemotron_h" and "layer_types" in spec.config:
        _config_class_check(spec)
    window = _transformers_window(spec)
    all_sliding = types is None or all(t == "sliding_attention" for t in types)
    model_window = window if all_sliding else None
    if rule == "zamba2":
        hybrid, blocks = zamba2_blocks(spec)
        layers = [_attention(j, None, model_window) for j in range(hybrid)]
        layers += [LayerSpecPlan(hybrid + i, MAMBA) for i in range(blocks)]
    else:
        planned = (_layer(spec, rule, i, types, window, model_window) for i in range(n))
        layers = [layer for layer in planned if layer is not None]
    if rule == "falcon_h1":  # the parallel Mamba-2 mixers, after the attention layers
        layers += [LayerSpecPlan(n + i, MAMBA) for i in range(n)]
    if rule == "model_window" and types and len(set(types)) > 1:
        max_window = spec.config.get("max_window_layers")
        if max_window != n:
            raise qwen2_window_layers(max_window, n)
    return Interpretation(arch, rule, tuple(types) if types else None, window, model_window, tuple(layers))


# Zamba2Config's layers_block_type when config.json has none (configuration_zamba2.py, transformers 5.20)
ZAMBA2_DEFAULT_BLOCKS = (["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7 + ["linear_attention"] * 4
                         + ["hybrid"] + ["linear_attention"] * 3 + ["hybrid"] + ["linear_attention"] * 2)


def zamba2_blocks(spec: ModelSpec) -> tuple[int, int]:
    """Zamba2Config's hybrid count and the decoder layers zamba2.py builds. The class counts hybrid_layer_ids from
    `layers_block_type` (its default list when unset) before it applies a `layer_types` key, which then replaces
    `layers_block_type` as an alias: the model class loops over that list, and keeps one Attention per counted id."""
    raw = spec.config.get("layers_block_type")
    blocks = raw if isinstance(raw, list) else ZAMBA2_DEFAULT_BLOCKS
    looped = spec.config.get("layer_types")
    looped = looped if isinstance(looped, list) else blocks
    return sum(1 for kind in blocks if kind == "hybrid"), len(looped)


def transformers_backend(spec: ModelSpec, interp: Interpretation) -> Interpretation:
    """The layers of vLLM's Transformers modeling backend where kvdoctor models it (releases.TRANSFORMERS_BACKEND_PLANNED):
    an Attention per text layer, its own window where the top-level config's `layer_types` says sliding_attention
    (the top-level `sliding_window`), else the model-level window."""
    raw = spec.raw_config
    types, window = (interp.layer_types, interp.sliding_window) if "text_config" not in raw else (
        raw.get("layer_types"), raw.get("sliding_window"))

    def own(i: int) -> int | None:
        return window if types and i < len(types) and types[i] == "sliding_attention" else None

    layers = tuple(_attention(i, own(i), interp.model_window) for i in range(spec.num_hidden_layers))
    return msgspec.structs.replace(interp, rule="transformers_backend", layers=layers)


# Multimodal classes whose __init__ builds the vision tower from `config.vision_config` (qwen3_5.py L424 and L636 at
# v0.26.0, whose registry reaches a text-only Qwen3.5 config's ...ForCausalLM only by swapping its suffix for these),
# and the transformers configuration class of the text-only model types that then lack it (configuration_qwen3_5.py
# and configuration_qwen3_5_moe.py): vLLM's AttributeError names that class (VLM290).
VISION_TOWER_CLASSES = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})
TEXT_CONFIG_CLASS = {"qwen3_5_text": "Qwen3_5TextConfig", "qwen3_5_moe_text": "Qwen3_5MoeTextConfig"}


def vision_tower_without_config(spec: ModelSpec, loaded: str | None) -> str | None:
    """The text config class vLLM's multimodal class asks for `vision_config` (VISION_TOWER_CLASSES), else None."""
    if loaded not in VISION_TOWER_CLASSES or loaded == architecture(spec) or "vision_config" in spec.raw_config:
        return None
    return TEXT_CONFIG_CLASS.get(str(spec.raw_config.get("model_type")))


GENERATING = ("ForCausalLM", "ForConditionalGeneration")  # wrapped as ...ForCausalLM (a pooling class is not planned)
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")  # ModelArchConfig's order


def transformers_backend_class(spec: ModelSpec) -> str:
    """The class vLLM resolves the architecture to (ModelConfig._get_transformers_backend_cls, a generating model):
    MultiModal for a composite config, MoE where the text config states experts."""
    experts = next((spec.config[k] for k in EXPERT_KEYS if spec.config.get(k)), 0)
    experts = experts[0] if isinstance(experts, list) and experts else experts
    return ("Transformers" + ("MultiModal" if "text_config" in spec.raw_config else "")
            + ("MoE" if experts else "") + "ForCausalLM")


def _config_class_check(spec: ModelSpec) -> None:
    """NemotronHConfig reads `layer_types` as its block types and refuses entries other than its own
    (kvdoctor's table reads the pattern): run the configuration class itself, as vLLM does."""
    try:
        hf_config.read(CONFIG_CLASS_TYPE.get(spec.model_type, spec.model_type), spec.config)
    except hf_config.Rejected as rejected:
        raise config_class_rejects(rejected) from None


def rule_for(spec: ModelSpec, arch: str, types: list[str] | None) -> str:
    """The table's rule; for an architecture it does not list, what vLLM's shared code does: MLA when
    the config has a latent (`kv_lora_rank`, ModelConfig.use_mla), a Mamba-style state for
    `linear_attention` entries, else the per-layer `layer_types` reading of Llama-like classes."""
    if arch in RULES:
        return RULES[arch]
    if (spec.config.get("linear_attn_config") or {}).get("kda_layers"):
        return "kimi_linear"  # KDA state on the listed layers whatever the class: not MLA throughout
    if spec.config.get("kv_lora_rank"):
        return "mla"
    if types and "linear_attention" in types:
        return "linear_hybrid"
    return "layer_types"


def _layer(spec: ModelSpec, rule: str, i: int, types: list[str] | None, window: int | None,
           model_window: int | None) -> LayerSpecPlan | None:
    """The layer's spec; None for a layer vLLM builds none for (a block without a token mixer)."""
    kind = types[i] if types else None
    if rule == "lfm2":
        return _attention(i, None, None) if kind == "full_attention" else LayerSpecPlan(i, MAMBA)
    if rule in ("mamba1", "mamba2"):
        return LayerSpecPlan(i, MAMBA)
    if rule in ("falcon_h1", "no_cache_config"):  # plain Attention, no window (Falcon-H1: the layer's attention half)
        return _attention(i, None, None)
    if rule == "jamba":  # JambaConfig.layer_types is a property (linear / full attention): no model-level window
        return LayerSpecPlan(i, MAMBA) if spec.layers[i].kind == MAMBA_KIND else _attention(i, None, None)
    if rule == "nemotron_h":
        mixer = spec.layers[i].kind
        if mixer == MAMBA_KIND:
            return LayerSpecPlan(i, MAMBA)
        return _attention(i, None, model_window) if mixer == FULL_KIND else None
    if rule == "mimo_v2":
        pattern, size = spec.config.get("hybrid_layer_pattern"), spec.config.get("sliding_window_size")
        if isinstance(pattern, list) and len(pattern) == spec.num_hidden_layers and isinstance(size, int):
            return _attention(i, size if pattern[i] == 1 else None, None)
        rule = "layer_types"  # no pattern to read: the model class would fail on it; the common reading
    if rule in ("mla", "kimi_linear"):
        if rule == "kimi_linear" and _kimi_kda_layer(spec, i):
            return LayerSpecPlan(i, MAMBA)
        return LayerSpecPlan(i, MLA)
    if rule == "qwen3_next":
        if kind not in QWEN3_NEXT_TYPES:
            raise unknown_layer_type(kind, i)
        if kind == "linear_attention":
            return LayerSpecPlan(i, MAMBA)
        return _attention(i, None, model_window)
    if rule == "linear_hybrid":
        if kind == "linear_attention":
            return LayerSpecPlan(i, MAMBA)
        return _attention(i, window if kind == "sliding_attention" else None, model_window)
    if rule == "llama4":
        chunk = spec.config.get("attention_chunk_size")
        rope = _llama4_rope_layers(spec)
        if chunk and rope[i]:
            return LayerSpecPlan(i, CHUNKED, chunk=chunk)
        return _attention(i, None, model_window)  # its NoPE layers: plain Attention, no window of their own
    if rule == "even_layers":
        return _attention(i, window if i % 2 == 0 else None, model_window)
    if rule == "model_window":
        return _attention(i, None, model_window)
    return _attention(i, window if kind == "sliding_attention" else None, model_window)


def _kimi_kda_layer(spec: ModelSpec, i: int) -> bool:
    """KimiLinearConfig.is_kda_layer: `linear_attn_config.kda_layers` lists 1-indexed layers; vLLM
    asks it, not `layer_types`."""
    lac = spec.config.get("linear_attn_config") or {}
    return (i + 1) in set(lac.get("kda_layers") or ())


def _attention(i: int, per_layer: int | None, model_window: int | None) -> LayerSpecPlan:
    window = per_layer if per_layer is not None else model_window
    return LayerSpecPlan(i, SLIDING if window else FULL, window=window)


def _llama4_rope_layers(spec: ModelSpec) -> list[bool]:
    """Llama4TextConfig: `no_rope_layers[i]` is 1 for a RoPE layer; by default every
    `no_rope_layer_interval`-th layer (4) has no RoPE. vLLM chunks the RoPE layers only."""
    cfg: dict[str, Any] = spec.config
    given = cfg.get("no_rope_layers")
    if isinstance(given, list) and given:
        return [bool(v) for v in given]
    interval = cfg.get("no_rope_layer_interval") or 4
    return [(i + 1) % interval != 0 for i in range(spec.num_hidden_layers)]
