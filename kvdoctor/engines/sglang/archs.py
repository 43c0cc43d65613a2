"""Per-architecture facts of SGLang 0.5.23 that decide pools and windows, with where each is written.

A cache of SGLang's own tables; tests/test_sglang_cuda.py checks the decisions they lead to against
goldens/sglang_check.json (SGLang's code run on its CUDA path). Paths are in the v0.5.23 tree under
python/sglang/srt/.
"""
from __future__ import annotations

import json
from functools import cache
from typing import Any

from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import key as release_key
from kvdoctor.resources import data_dir

TAG = "v0.5.23"
BLOB = f"https://github.com/sgl-project/sglang/blob/{TAG}/python/sglang/srt"


def ref(path_line: str) -> str:
    """`configs/model_config.py#L2651` -> a pinned URL."""
    return f"{BLOB}/{path_line}"


# arg_groups/overrides.py:403 `_MAMBA_EXTRA_BUFFER_ARCHS`: with the radix cache on, the overlap
# scheduler (or a page size > 1) and the triton linear-attention backend (the CUDA default),
# `--mamba-radix-cache-strategy auto` resolves to `extra_buffer` for these; on other archs to
# `no_buffer`, which also turns the overlap scheduler off (overrides.py:477-486).
EXTRA_BUFFER_ARCHS = frozenset({
    "KimiLinearForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM", "Qwen4ExpForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
    "MiniCPMV4_7ForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
    "BailingMoeV3VLForConditionalGeneration", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
    "Glm5NextForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "NemotronH_Omni_Reasoning_V3", "KimiK3ForConditionalGeneration", "InklingForConditionalGeneration",
    "InklingForConditionalGenerationMTP",
})
# configs/model_config.py:2651 `is_hybrid_swa_model`: architectures that get separate SWA pools.
HYBRID_SWA_ARCHS = frozenset({
    "BeamForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
    "DeepseekV4ForCausalLMDSpark", "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM",
    "IQuestQ1ForCausalLM", "IQuestQ1MTP", "MiMoV2FlashForCausalLM", "MiMoV2MTP", "Step3p5ForCausalLM",
    "Step3p5MTP", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration", "DiffusionGemmaForBlockDiffusion",
    "LagunaForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration",
    "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP", "UnlimitedOCRForCausalLM",
})

# configs/model_config.py:88 SWA_SINK_ARCHS: their SWA / full layer ids come from `layer_types`.
LAYER_TYPES_SPLIT_ARCHS = frozenset({
    "GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM", "IQuestQ1MTP",
    "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN", "BeamForCausalLM", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration",
    "DiffusionGemmaForBlockDiffusion", "LagunaForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration",
})

# Config-time overrides that set disable_hybrid_swa_memory (arg_groups/model_overrides/*.py), with the
# warning SGLang logs. These families are not on the allow-list either, so the override changes nothing
# about the pools; it is the reason SGLang prints.
OVERRIDE_DISABLES = {
    "Gemma2ForCausalLM": ("Disable hybrid SWA memory for {arch} as it is not yet supported.",
                          "arg_groups/model_overrides/gemma2_gemma3.py#L24"),
    "Gemma3ForCausalLM": ("Disable hybrid SWA memory for {arch} as it is not yet supported.",
                          "arg_groups/model_overrides/gemma2_gemma3.py#L24"),
    "Gemma3ForConditionalGeneration": ("Disable hybrid SWA memory for {arch} as it is not yet supported.",
                                       "arg_groups/model_overrides/gemma2_gemma3.py#L24"),
    "Olmo2ForCausalLM": ("Disabling hybrid SWA memory for {arch} as it is not yet supported.",
                         "arg_groups/model_overrides/olmo2.py#L21"),
}

# `--dtype` that SGLang's model overrides set whatever the config says: always bfloat16 for these
# (arg_groups/model_override_base.py:20), and for GptOssForCausalLM with an mxfp4 quantization_config
# (arg_groups/model_overrides/gpt_oss.py:63).
BF16_ARCHS = frozenset({"MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"})
BF16_WITH_MXFP4_ARCHS = frozenset({"GptOssForCausalLM"})

# SGLang's own config classes rename some architectures (configs/olmo3.py:59: Olmo3 runs as Olmo2).
RENAMED = {"Olmo3ForCausalLM": "Olmo2ForCausalLM"}

# How each model class gives its attention layers a window (RadixAttention's sliding_window_size, which
# is SGLang's window_left: keys before the query). `alternate`: every even layer id, whatever
# layer_types says; `layer_types`: the layers typed sliding_attention; absent: no window at all.
# Every class here passes sliding_window - 1, i.e. kvdoctor's `window` = sliding_window.
WINDOW_RULES = {
    "Gemma2ForCausalLM": ("alternate", "models/gemma2.py#L173"),
    "Gemma3ForCausalLM": ("layer_types", "models/gemma3_causal.py#L185"),
    "Gemma3ForConditionalGeneration": ("layer_types", "models/gemma3_causal.py#L185"),
    "Olmo2ForCausalLM": ("layer_types", "models/olmo2.py#L127"),
    "GptOssForCausalLM": ("layer_types", "models/gpt_oss.py#L453"),
    "Gemma4ForCausalLM": ("layer_types", "models/gemma4_causal.py#L325"),
    "Gemma4ForConditionalGeneration": ("layer_types", "models/gemma4_causal.py#L325"),
    # MiMo-V2 passes `sliding_window_size` itself as window_left on hybrid_layer_pattern == 1 layers.
    "MiMoV2FlashForCausalLM": ("pattern", "models/mimo_v2.py#L891"),
    # Llama-4: chunked attention (iRoPE) on every layer but each fourth, chunk = attention_chunk_size.
    "Llama4ForConditionalGeneration": ("irope", "models/llama4.py#L218"),
}
# Classes read to pass no window to their attention at all (a config's sliding_window is not masked):
# LlamaAttention builds RadixAttention without sliding_window_size, and Phi-3 / Mistral derive from it.
NO_WINDOW_ARCHS = {
    "LlamaForCausalLM": "models/llama.py",
    "Phi3ForCausalLM": "models/llama.py#L956",
    "MistralForCausalLM": "models/mistral.py",
    "Qwen2ForCausalLM": "models/qwen2.py",
}
# Classes whose window function is `config.sliding_window - 1`: a null window fails at model load.
WINDOW_MINUS_ONE_SOURCES = {
    "Gemma2ForCausalLM": "models/gemma2.py#L53",
    "Gemma3ForCausalLM": "models/gemma3_causal.py#L65",
    "Gemma3ForConditionalGeneration": "models/gemma3_causal.py#L65",
    "Olmo2ForCausalLM": "models/olmo2.py#L60",
    "GptOssForCausalLM": "models/gpt_oss.py#L132",
    "Gemma4ForCausalLM": "models/gemma4_causal.py#L84",
    "Gemma4ForConditionalGeneration": "models/gemma4_causal.py#L84",
    "MuseGlimmerForCausalLM": "models/muse_glimmer.py#L120",
    "MuseGlimmerForConditionalGeneration": "models/muse_glimmer.py#L120",  # subclasses the CausalLM (L944)
}
# Architectures whose config class SGLang registers itself (utils/hf_transformers/common.py, `deepseek_v4`) as
# a strict dataclass typing sliding_window as int: a null window is refused while the config loads.
STRICT_WINDOW_ARCHS = frozenset({"DeepseekV4ForCausalLM"})
# Classes whose window function is `sliding_window - 1` with a guard for a null window (no window then).
WINDOW_MINUS_ONE_OR_NONE = {"Exaone4ForCausalLM": "models/exaone4.py#L47", "AfmoeForCausalLM": "models/afmoe.py#L70"}
# ModelConfig's `get_hybrid_layer_ids` iterates these classes' `layer_types` (configs/model_config.py#L2766),
# which their config class leaves null when config.json has none.
LAYER_TYPES_ITERATED = frozenset({"MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration"})


def serving_arch(raw_config: dict) -> str:
    """The architecture SGLang serves the model as (the first listed, after its own renames)."""
    archs = raw_config.get("architectures") or [""]
    return RENAMED.get(archs[0], archs[0])


# SGLang's own config classes for these lay out the hybrid from `full_attention_interval` alone (attention on
# every interval-th layer, gated DeltaNet elsewhere) and never read `layer_types` (configs/qwen3_next.py:260;
# Qwen3.5's text config subclasses it).
INTERVAL_ARCHS = {
    "Qwen3NextForCausalLM": "configs/qwen3_next.py#L260",
    "Qwen3_5ForConditionalGeneration": "configs/qwen3_5.py#L15",
    "Qwen3_5MoeForConditionalGeneration": "configs/qwen3_5.py#L119",
    "Qwen3_5ForCausalLM": "configs/qwen3_5.py#L15",
    "Qwen3_5MoeForCausalLM": "configs/qwen3_5.py#L119",
}


# SGLang's LFM2 config classes give the KV pool only the layers typed `full_attention` and the conv state only
# those typed `conv` / `short_conv` (configs/lfm2.py#L27, lfm2_vl.py, lfm2_moe.py#L28): a layer of any other
# type gets neither.
TYPED_CONV_ARCHS = {
    "Lfm2ForCausalLM": "configs/lfm2.py#L27",
    "Lfm2MoeForCausalLM": "configs/lfm2_moe.py#L28",
    "Lfm2VlForConditionalGeneration": "configs/lfm2_vl.py#L24",
}

# ModelConfig computes no SWA / full layer ids for DeepSeek-V4 (configs/model_config.py#L1226); with hybrid-SWA on
# its pools come from DSV4PoolConfigurator (model_executor/pool_configurator.py#L1718), which has no
# "at least one SWA layer" assertion.
DEEPSEEK_V4_ARCHS = frozenset({"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark"})

# configs/model_config.py#L191 `is_deepseek_dsa`: these with an `index_topk` are DeepSeek sparse attention (DSA) models;
# their model classes build every attention layer as MLA with an indexer, in a DSATokenToKVPool, and read no
# `layer_types` or window.
DSA_ARCHS = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN", "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGenerationNextN", "Glm5NextForConditionalGeneration", "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN", "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
})

# MiniMax-M3's sparse attention (configs/model_config.py#L426 `is_minimax_sparse`): without hybrid-SWA memory its
# layers live in a `MiniMaxSparseKVPool` (mem_cache/memory_pool.py#L5847), an MHA pool over every layer plus a
# one-head index pool for the sparse layers (`sparse_attention_config`).
MINIMAX_SPARSE_ARCHS = frozenset({"MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"})

# Pure state-space models: no attention layer, attention arch SSM, every layer in the MambaPool
# (configs/model_config.py#L156 PURE_MAMBA1_ARCHITECTURES, #L164 PURE_SSM_ARCHITECTURES). The Mamba-1 ones
# size a full-rank state (configs/mamba.py, `Mamba2StateShape.create_full_rank`).
PURE_MAMBA1_ARCHS = frozenset({"FalconMambaForCausalLM", "MambaForCausalLM"})
PURE_SSM_ARCHS = frozenset({"Mamba2ForCausalLM"}) | PURE_MAMBA1_ARCHS


# The model types SGLang's config loader resolves without remote code (transformers' own and SGLang's registered
# classes), its model classes, transformers' Transformers-backend compatibility and composite classes' default
# text configs: written by tools/sglang_registry.py from the pinned release's venv.
REGISTRY = data_dir("sglang_registry.json")


@cache
def registry(release: str = PINS["sglang"]) -> dict[str, Any]:
    """The shipped facts of SGLang's config loader and model registry (model types, architectures, versions) at
    `release`: the default release's lists less what the nearest measured release at or after it lacks (its
    venv's, with the transformers it pins: tools/sglang_registry.py --release; an unmeasured release reads the
    next measured one, as vLLM's registry does)."""
    doc = json.loads(REGISTRY.read_text())
    later = [v for v in sorted(doc.get("releases", {}), key=release_key) if release_key(v) >= release_key(release)]
    delta: dict[str, Any] = {}
    if release_key(release) < release_key(doc["sglang"]) and later:
        delta = doc["releases"][later[0]]
        doc = {**doc, "sglang": later[0], "transformers": delta["transformers"]}
    types = (set(doc["model_types"]) - set(delta.get("model_types_absent", ()))) | set(delta.get("model_types_added", ()))
    names = (set(doc["architectures"]) - set(delta.get("architectures_absent", ()))) | set(
        delta.get("architectures_added", ()))
    return {**doc, "model_types": frozenset(types), "architectures": frozenset(names)}


GEOMETRY = ("num_hidden_layers", "num_key_value_heads", "head_dim")


def served_text_config(raw: dict) -> dict[str, Any] | None:
    """The text config SGLang serves for a composite model type whose config.json has no text_config: its
    class's default one (as the registry read it), whatever the top level states; else None."""
    served = registry().get("text_config_defaults", {}).get(raw.get("model_type"))
    return served if served and "text_config" not in raw else None


def default_text_config(raw: dict) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]] | None:
    """(the text config SGLang serves, {key: (stated, served)}) for a composite model type whose config.json
    keeps differing text geometry at its top level and has no text_config (SGL251); else None."""
    served = served_text_config(raw)
    if served is None:
        return None
    differs = {k: (raw[k], served.get(k)) for k in GEOMETRY if isinstance(raw.get(k), int) and raw[k] != served.get(k)}
    return (served, differs) if differs else None
