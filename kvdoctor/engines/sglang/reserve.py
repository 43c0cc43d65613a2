"""SGLang's defaults for the memory it holds back from the KV pools: `chunked_prefill_size`, the decode
CUDA graphs' largest batch and `mem_fraction_static`, as its server arguments resolve them from the GPU's
memory and the parallel sizes when the deployer leaves them unset.

0.5.23 (read from the wheel, `srt/arg_groups/memory_hook.py`, handle_gpu_memory_settings and
reserve_for_graph_mb): every figure in MiB of the GPU's memory as nvidia-smi reports it,

    reserved = 512 + 1.5 x max(chunked_prefill_size, 2048) + 1024 x tp x pp / 8
               + 2 x decode max_bs                              (decode CUDA graphs)
               + attention DP: 3 x max_bs x dp (+ 1.5 x max_bs x dp above a max_bs of 300)
               + prefill CUDA graphs: 8 per captured size, or 1536 with an MLA backend (on CUDA, and not
                 for the models `prefill_graphs_off` names)
    at least 10240 on GPUs above 60 GiB;  mem_fraction_static = round((gpu - reserved) / gpu, 3),
    times `vision_factor` for a multimodal model's vision tower (`vision`)

From 0.5.15 (the earliest release read) the prefill graphs are breakable by default on CUDA and reserved the
same way (model_executor/cuda_graph_config.py default_prefill_backend, server_args.py:3660-3670 @ 0.5.15);
goldens/sglang_fraction-0.5.21.json holds 0.5.21 to it. Releases 0.5.0 to 0.5.14 were not read one by one and
are priced without them (piecewise CUDA graphs off by default in the stored copies: `if
self.enable_piecewise_cuda_graph` in server_args.py). Before 0.5.0 the fraction
was a table by TP size alone (0.88, 0.87 from TP 2, 0.85 from 4, 0.81 from 8, 0.79 from 16) and the
chunked prefill 2048 tokens below 25,000 MiB, else 8192. The 0.5.0 boundary is where the stored copies of
server_args.py switch from one form to the other; the tags between 0.4.10 and 0.5.0 were not read one by one.

`pool` is the one formula for the memory the pools get, read by `kvdoctor fit` (sglang.fit) and by
`kvdoctor budget --gpu-memory` (sglang.budget): the pools get what the weights leave of the memory free
before loading, less (1 - mem_fraction_static) of it (srt/model_executor/model_runner.py profile_max_num_token
up to 0.5.22, srt/mem_cache/kv_cache_configurator.py _profile_available_bytes at 0.5.23).
"""
from __future__ import annotations

import math

import msgspec

from kvdoctor.engines.budget.common import CUDA_CONTEXT, MiB
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import key
from kvdoctor.engines.sglang.archs import DEEPSEEK_V4_ARCHS
from kvdoctor.engines.sglang.releases import (BREAKABLE_MULTIMODAL, KDA_GRAPHS_OFF_SINCE, MID_GPU_ROW_SINCE,
                                              PREFILL_GRAPHS_SINCE, RESERVE_SINCE, listed_at)

# Memory in use before the weights load: the CUDA context alone (vLLM's calibrated 0.13 GiB: the same runtime), and
# in a TP group SGLang's communicators and custom all-reduce buffers: 2.51 GiB on H200 at TP 8 ("Load weight begin.
# avail mem=137.29 GB" of 139.80 GiB, sgl-project/sglang#11716). On PCIe-only cards beyond two ranks the custom
# all-reduce stays off ("Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs",
# custom_all_reduce.py, the check vLLM's carries too): the group holds NCCL's communicator alone, priced as vLLM's
# TP group before 0.19 (0.55 GiB, calibrated on the vLLM 0.11 logs).
PRELOAD = {"alone": CUDA_CONTEXT, "group": 2570 * MiB, "nccl": 563 * MiB}
PRELOAD_SOURCE = {"alone": "the CUDA context, calibrated on vLLM 0.11 logs (the same CUDA runtime)",
                  "group": "memory in use before loading in a TP group: sgl-project/sglang#11716 (2.51 GiB, H200, TP 8)",
                  "nccl": "a TP group of more than two PCIe-only GPUs, no custom all-reduce: NCCL's communicator, "
                          "priced as vLLM's TP group before 0.19 (0.55 GiB, vLLM 0.11 calibration logs)"}


def preload_kind(tp: int, pp: int, pcie_only: bool) -> str:
    """Which PRELOAD a rank has: alone, in a group with SGLang's custom all-reduce, or in one without it."""
    if tp * pp == 1:
        return "alone"
    return "nccl" if pcie_only and tp > 2 else "group"


SOURCE = "sglang {release} srt/arg_groups/memory_hook.py (handle_gpu_memory_settings, reserve_for_graph_mb)"
OLD_SOURCE = "sglang {release} srt/server_args.py __post_init__ (mem_fraction_static by TP size)"
# (memory below, in MiB; chunked_prefill_size; decode max_bs below TP 4; from TP 4) @ 0.5.23
_BY_MEMORY = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160),
              (90 * 1024, 8192, 256, 512), (160 * 1024, 8192, 256, 512))
_LARGEST = (16384, 512, 512)
_MID_ROW_BEFORE = (35 * 1024, 2048, 24, 80)  # before MID_GPU_ROW_SINCE


class Defaults(msgspec.Struct, frozen=True):
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    mem_fraction_static: float
    reserved_mib: float  # what the formula held back (0: the TP table of older releases)
    source: str


# srt/configs/model_config.py:2391-2473 @ 0.5.23 (`multimodal_model_archs`): the architectures SGLang serves as
# multimodal (MIMO_V2_MULTIMODAL_ARCHS among them)
MULTIMODAL_ARCHS = frozenset({
    "BailingMM2NativeForConditionalGeneration", "BailingMMNativeForConditionalGeneration",
    "BailingMoeV3VLForConditionalGeneration", "CLIPModel", "Cohere2VisionForConditionalGeneration",
    "Cosmos3EdgeForConditionalGeneration", "DeepseekOCRForCausalLM", "DeepseekVL2ForCausalLM",
    "DiffusionGemmaForBlockDiffusion", "Dots3NoteForCausalLM", "DotsOCRForCausalLM", "DotsVLMForCausalLM",
    "EmbeddingGemma2Model", "Ernie4_5_VLMoeForConditionalGeneration", "Gemma3ForConditionalGeneration",
    "Gemma3nForConditionalGeneration", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration",
    "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "Glm5NextForConditionalGeneration",
    "GlmAsrForConditionalGeneration", "GlmImageForConditionalGeneration", "GlmOcrForConditionalGeneration",
    "Grok1AForCausalLM", "Grok1VForCausalLM", "InternS1ForConditionalGeneration", "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration", "InternVLChatModel",
    "JetVLMForConditionalGeneration", "KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration",
    "Lfm2VlForConditionalGeneration", "LightOnOCRForConditionalGeneration", "Llama4ForConditionalGeneration",
    "LlavaForConditionalGeneration", "LlavaLlamaForCausalLM", "LlavaMistralForCausalLM", "LlavaQwenForCausalLM",
    "LlavaVidForCausalLM", "LocateAnythingForConditionalGeneration", "MiDashengLMModel", "MiMoV2ASRForCausalLM",
    "MiMoV2ForCausalLM", "MiniCPMO", "MiniCPMV", "MiniMaxM3SparseForConditionalGeneration",
    "Mistral3ForConditionalGeneration", "MllamaForConditionalGeneration", "MossVLForConditionalGeneration",
    "MultiModalityCausalLM", "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
    "NVILAForConditionalGeneration", "NVILALiteForConditionalGeneration", "NemotronH_Nano_Omni_Reasoning_V3",
    "NemotronH_Nano_VL_V2", "NemotronH_Omni_Reasoning_V3", "POINTSV15ChatModel", "PaddleOCRVLForConditionalGeneration",
    "Phi4MMForCausalLM", "PixtralForConditionalGeneration", "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "Sarashina2VisionForCausalLM", "Step3VLForConditionalGeneration", "Step3p7ForConditionalGeneration",
    "StepVLForConditionalGeneration", "UnlimitedOCRForCausalLM", "VoxtralForConditionalGeneration",
    "WhisperForConditionalGeneration",
})
# srt/configs/model_config.py:690-717 @ 0.5.23: served text-only unless --enable-multimodal
MULTIMODAL_OFF = frozenset({"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                            "Step3VLForConditionalGeneration", "InklingForConditionalGeneration"})
VISION_SOURCE = "srt/arg_groups/memory_hook.py adjust_mem_fraction_for_vlm @ 0.5.23 (server_args.py at 0.5.15-0.5.20)"
# The sub-configs SGLang takes the language model's config from (srt/utils/hf_transformers/common.py:582-601
# get_hf_text_config @ 0.5.23); a model with one is multimodal (model_config.py:809, "hf_config is not hf_text_config")
TEXT_SUBCONFIGS = ("thinker_config", "llm_config", "language_config", "text_config")
# SGLang's own config classes that build a vision tower and a text config when the checkpoint names none
# (srt/configs/step3p7.py:69-83 @ 0.5.23: Step3p7VisionEncoderConfig, whose width and depth are `width`/`layers`,
# so the fraction's rule reads its 24 x 1024 defaults)
BUILT_TOWER = frozenset({"step3p7"})
# Vision config classes that read the tower's size from other keys or default it otherwise, by the model's
# model_type: (layers key, default, width key, default) @ 0.5.23. KimiK25VisionConfig takes `num_hidden_layers`
# and `hidden_size` (27 and 1152 by default) and keeps the checkpoint's vt_* keys aside (srt/configs/kimi_k25.py:45-68);
# KimiK3VisionConfig aliases them to vt_num_hidden_layers and vt_hidden_size (srt/configs/kimi_k3.py:17-18, 74-75).
TOWER_KEYS = {"kimi_k25": ("num_hidden_layers", 27, "hidden_size", 1152),
              "kimi_k3": ("vt_num_hidden_layers", 27, "vt_hidden_size", 1024)}


def multimodal(raw_config: dict) -> bool:
    """Whether SGLang serves the model as multimodal (ModelConfig.is_multimodal, srt/configs/model_config.py:690-717
    and 809-828 @ 0.5.23): multimodal is on for it (MULTIMODAL_OFF; MiMo-V2 only with both a vision and an audio
    config), and its architecture is one of `MULTIMODAL_ARCHS`, or its config has a language sub-config
    (`TEXT_SUBCONFIGS`, or a config class that builds one), or it is a DeepSeek-V4.1 with a vision tower.
    The default `--model-impl auto` is assumed: the vision/audio-config rule of an explicit Transformers backend
    does not apply."""
    archs = raw_config.get("architectures") or []
    if not archs or archs[0] in MULTIMODAL_OFF:
        return False
    if archs[0] == "MiMoV2ForCausalLM" and not ("vision_config" in raw_config and "audio_config" in raw_config):
        return False
    return (any(a in MULTIMODAL_ARCHS for a in archs) or any(k in raw_config for k in TEXT_SUBCONFIGS)
            or raw_config.get("model_type") in BUILT_TOWER
            or (raw_config.get("model_type") == "deepseek_v41" and (raw_config.get("vision_n_layers") or 0) > 0))


def vision(raw_config: dict) -> tuple[int, int] | None:
    """The vision tower SGLang shrinks its default fraction for, (layers, hidden size), or None: a model it serves
    as multimodal whose config has a vision config, its layers and width as the config class reads them
    (`TOWER_KEYS`; else `num_hidden_layers` and `hidden_size`, 24 and 1024 where they are not set: a
    Qwen2.5-VL tower's `depth` is not read)."""
    tower = raw_config.get("vision_config")
    built = raw_config.get("model_type") in BUILT_TOWER
    if not multimodal(raw_config) or not (isinstance(tower, dict) or built):
        return None
    tower = tower if isinstance(tower, dict) else {}
    layers_key, layers, width_key, width = TOWER_KEYS.get(raw_config.get("model_type") or "",
                                                          ("num_hidden_layers", 24, "hidden_size", 1024))
    return int(tower.get(layers_key) or layers), int(tower.get(width_key) or width)


def vision_factor(tower: tuple[int, int]) -> float:
    """What SGLang multiplies its default fraction by for a vision tower: 0.95, less a tenth for every doubling of
    the tower's layers x width^2 over a ViT-L/14's (24 x 1024^2), within [0.8, 1.05] (`VISION_SOURCE`)."""
    layers, width = tower
    ratio = layers * width ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


# Up to 0.5.16 an MLA backend turns the prefill graphs off ("MLA attention", server_args.py:3774 @ 0.5.16); 0.5.17
# spares DSA models, a DeepSeek-V3-family architecture with an `index_topk` ("MLA attention (non-DSA)",
# server_args.py:4469-4471, configs/model_config.py:106-121 is_deepseek_dsa @ 0.5.17), and turns them off for
# NemotronH (server_args.py:4477-4479, model_config.py:136-141); 0.5.18 has neither rule.
DSA_GRAPHS_SINCE, MLA_GRAPHS_SINCE = "0.5.17", "0.5.18"
DSA_ARCHS = frozenset({"DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
                       "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
                       "GlmMoeDsaForCausalLMNextN", "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN"})
NEMOTRON_H_ARCHS = frozenset({"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronHForCausalLMMTP"})
# From 0.5.16 to 0.5.21 the multimodal architectures validated for torch.compile piecewise prefill graphs take them
# instead of the breakable ones, whose rules then do not apply ("Using tc_piecewise CUDA graph for validated
# multimodal decoder prefill.", server_args.py:3663-3671 @ 0.5.16, arg_groups/cuda_graph_hook.py:150 @ 0.5.21; gone
# in 0.5.22), with multimodal_piecewise_cuda_graph_supported_model_archs (configs/model_config.py @ 0.5.16-0.5.21)
PIECEWISE_MULTIMODAL = frozenset({"Cohere2VisionForConditionalGeneration", "KimiK25ForConditionalGeneration",
                                  "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"})
PIECEWISE_MULTIMODAL_RELEASES = ("0.5.16", "0.5.22")  # [since, until)
# srt/arg_groups/cuda_graph_hook.py:375-390 @ 0.5.23: Muse Glimmer's prefill graphs stop at 512 tokens
PREFILL_MAX_BS = {"MuseGlimmerForCausalLM": 512, "MuseGlimmerForConditionalGeneration": 512}
PREFILL_OFF_SOURCE = "srt/arg_groups/cuda_graph_hook.py:170-255 disable_breakable_cudagraph_if_incompatible @ 0.5.23"


def kda(raw_config: dict) -> bool:
    """Kimi Delta Attention layers (srt/configs/model_config.py:230-252 uses_kda_attention @ 0.5.23): the config or
    its language sub-config lists `linear_attn_config.kda_layers`, or has linear_attention layer types with
    `linear_num_heads` and `linear_head_dim`."""
    subs = [raw_config] + [raw_config[k] for k in TEXT_SUBCONFIGS if isinstance(raw_config.get(k), dict)]
    for c in subs:
        linear = c.get("linear_attn_config")
        if isinstance(linear, dict) and linear.get("kda_layers"):
            return True
        if ("linear_attention" in (c.get("layer_types") or []) and c.get("linear_num_heads") is not None
                and c.get("linear_head_dim") is not None):
            return True
    return False


def prefill_graphs_off(raw_config: dict, release: str = PINS["sglang"], mla: bool = False) -> str | None:
    """Why SGLang `release` turns its breakable prefill CUDA graphs off by default for this model, or None: KDA
    hybrids other than GLM-5-Next (from KDA_GRAPHS_OFF_SINCE), DeepSeek-V4 (without prefill context parallelism),
    multimodal models not validated for them (`BREAKABLE_MULTIMODAL`), and before MLA_GRAPHS_SINCE an MLA backend
    (`mla`) and NemotronH (`PREFILL_OFF_SOURCE`). The rules on deployer settings (context parallelism, two-batch
    overlap, an a2a backend, attention DP and LoRA before 0.5.17) are not modelled: their defaults leave the graphs
    on."""
    archs = raw_config.get("architectures") or []
    if not archs:
        return None
    since, until = PIECEWISE_MULTIMODAL_RELEASES
    if key(since) <= key(release) < key(until) and archs[0] in PIECEWISE_MULTIMODAL and multimodal(raw_config):
        return None  # torch.compile piecewise graphs, whose own rules are not modelled
    before = key(release) < key(MLA_GRAPHS_SINCE)
    if before and mla and key(release) < key(DSA_GRAPHS_SINCE):
        return "MLA attention"
    text = next((raw_config[k] for k in TEXT_SUBCONFIGS if isinstance(raw_config.get(k), dict)), raw_config)
    if before and mla and not (archs[0] in DSA_ARCHS and text.get("index_topk") is not None):
        return "MLA attention (non-DSA)"
    if before and key(release) >= key(DSA_GRAPHS_SINCE) and archs[0] in NEMOTRON_H_ARCHS:
        return "NemotronH (hybrid Mamba2 prefill)"
    kda_off = key(release) >= key(KDA_GRAPHS_OFF_SINCE) and "Glm5NextForConditionalGeneration" not in archs
    if kda_off and kda(raw_config):
        return "KDA hybrid linear attention"
    if archs[0] in DEEPSEEK_V4_ARCHS:  # srt/configs/model_config.py:395-400 @ 0.5.23 (is_deepseek_v4)
        return "DeepSeek-V4"
    validated = set(archs) & listed_at(frozenset(BREAKABLE_MULTIMODAL), BREAKABLE_MULTIMODAL, release)
    if multimodal(raw_config) and not validated:
        return "multimodal model"
    return None


def prefill_graph_sizes(max_tokens: int) -> int:
    """How many token counts SGLang captures prefill graphs for, up to `max_tokens` (0.5.23's
    generate_prefill_cuda_graph_batch_sizes: steps of 4, 16, 32, 64, 256 and 512)."""
    steps = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256), (4608, max_tokens, 512))
    return sum(len([s for s in range(a, b + 1, step) if s <= max_tokens]) for a, b, step in steps)


def defaults(gpu_mib: float, tp: int, pp: int = 1, dp: int = 1, dp_attention: bool = False, mla: bool = False,
             release: str = PINS["sglang"], chunked: int | None = None, max_bs: int | None = None,
             max_running: int | None = None, cuda_graph: bool = True, cuda: bool = True,
             config: dict | None = None) -> Defaults:
    """The defaults `release` resolves on a GPU of `gpu_mib` MiB; a value the deployer set is kept. `cuda`: the
    platform is CUDA, the only one whose prefill graphs are on by default (0.5.23's default_prefill_backend,
    srt/model_executor/cuda_graph_config.py:119-123); on Apple silicon (MPS) only the decode graphs count.
    `config`: the model's config.json, whose vision tower shrinks the fraction (`vision`) and which may turn the
    prefill graphs off (`prefill_graphs_off`)."""
    if key(release) < key(RESERVE_SINCE):
        fraction = 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
        return Defaults(chunked_prefill_size=chunked or (2048 if gpu_mib < 25000 else 8192),
                        cuda_graph_max_bs=max_bs or (8 if gpu_mib < 25000 else 160), mem_fraction_static=fraction,
                        reserved_mib=0.0, source=OLD_SOURCE.format(release=release))
    rows = _BY_MEMORY if key(release) >= key(MID_GPU_ROW_SINCE) else (_BY_MEMORY[0], _MID_ROW_BEFORE, *_BY_MEMORY[2:])
    row = next((r for r in rows if gpu_mib < r[0]), None)
    default_chunked, small, large = row[1:] if row is not None else _LARGEST
    chunked = chunked or default_chunked
    bs = max_bs or (small if tp < 4 else large)
    if max_bs is None and max_running is not None:
        bs = min(bs, max_running)
    reserved = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024
    config = config or {}
    off = prefill_graphs_off(config, release, mla) if cuda and key(release) >= key(PREFILL_GRAPHS_SINCE) else None
    prefill_graphs = cuda and key(release) >= key(PREFILL_GRAPHS_SINCE) and off is None
    if cuda_graph:
        reserved += bs * 2
        if dp_attention:
            reserved += bs * dp * 3 + (bs * dp * 1.5 if bs > 300 else 0)
        if prefill_graphs:
            cap = PREFILL_MAX_BS.get((config.get("architectures") or [""])[0], chunked)
            reserved += 1536 if mla else prefill_graph_sizes(min(chunked, cap)) * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    source = SOURCE.format(release=release)
    if cuda_graph and off is not None:
        source += f"; no prefill CUDA graphs ({off}): {PREFILL_OFF_SOURCE}"
    tower = vision(config)
    if tower is not None:
        fraction *= vision_factor(tower)
        source += f"; x {vision_factor(tower):.4f} for the vision tower: {VISION_SOURCE}"
    return Defaults(chunked_prefill_size=chunked, cuda_graph_max_bs=bs, mem_fraction_static=fraction,
                    reserved_mib=reserved, source=source)


class Pool(msgspec.Struct, frozen=True):
    """What SGLang gives its KV pools on one rank, and how: the memory free before loading, the part
    (1 - mem_fraction_static) holds back, the pools' bytes (negative: the weights do not fit)."""

    preload: int
    reserved: int
    kv: int
    mem_fraction_static: float
    how: str
    defaults: Defaults


def pool(gpu_bytes: int, weights_bytes: int, tp: int = 1, pp: int = 1, dp: int = 1, dp_attention: bool = False,
         mla: bool = False, release: str = PINS["sglang"], chunked: int | None = None, max_running: int | None = None,
         cuda_graph: bool = True, mem_fraction_static: float | None = None, pcie_only: bool = False,
         config: dict | None = None) -> Pool:
    """The pools' memory on one rank of a GPU of `gpu_bytes` holding `weights_bytes` of weights (`pcie_only`:
    cards with no NVLink mesh, see PRELOAD)."""
    d = defaults(gpu_bytes / MiB, tp, pp, dp, dp_attention, mla, release, chunked=chunked, max_running=max_running,
                 cuda_graph=cuda_graph, config=config)
    if mem_fraction_static:
        mfs = float(mem_fraction_static)
        how = f"(total - non-torch) x (1 - mem_fraction_static {mfs}): srt/model_executor/model_runner.py"
    else:
        mfs = d.mem_fraction_static
        how = (f"(total - non-torch) x (1 - mem_fraction_static {mfs}), SGLang's default: " +
               (f"{d.reserved_mib:.0f} MiB reserved for activations and CUDA graphs, " if d.reserved_mib else "") +
               d.source)
    preload = PRELOAD[preload_kind(tp, pp, pcie_only)]
    before = gpu_bytes - preload
    reserved = before - math.floor(before * mfs)
    return Pool(preload=preload, reserved=reserved, kv=before - reserved - weights_bytes, mem_fraction_static=mfs,
                how=how, defaults=d)
