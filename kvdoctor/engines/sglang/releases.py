"""What changes in SGLang's KV layout between the profiled releases (0.5.15 to 0.5.23), as data with a
release range, each read from the code at both tags (`python/sglang/srt/...` at vX.Y.Z on GitHub, the
same files as in that release's wheel on PyPI).

The hybrid-SWA allow-list (`is_hybrid_swa_model`, configs/model_config.py) decides whether a model's
sliding layers get a pool of their own or full-length slots in the one pool; it only grew over these
releases (architectures joined, none left), so each entry here is the release it joined in.
"""
from __future__ import annotations

from kvdoctor.engines.releases import Ranged, key
from kvdoctor.engines.sglang import archs

TAG = "https://github.com/sgl-project/sglang/blob/v{}/python/sglang/srt/"

# architecture -> the first release whose is_hybrid_swa_model lists it (absent: listed in every profiled release)
HYBRID_SWA_SINCE: dict[str, str] = {
    "DeepseekV4ForCausalLMDSpark": "0.5.16", "InklingForConditionalGeneration": "0.5.16",
    "InklingForConditionalGenerationMTP": "0.5.16", "MellumForCausalLM": "0.5.16",
    "MuseGlimmerForCausalLM": "0.5.18", "MuseGlimmerForConditionalGeneration": "0.5.18",
    "GraniteMoeSWAForCausalLM": "0.5.19", "GraniteSWAForCausalLM": "0.5.19",
    "DiffusionGemmaForBlockDiffusion": "0.5.21", "IQuestQ1ForCausalLM": "0.5.21", "IQuestQ1MTP": "0.5.21",
    "EmbeddingGemma2Model": "0.5.22",
    "BeamForCausalLM": "0.5.23",
}
# is_hybrid_swa_model at each tag where the list changed
HYBRID_SWA_SOURCES = {
    "0.5.15": TAG.format("0.5.15") + "configs/model_config.py#L1833",
    "0.5.16": TAG.format("0.5.16") + "configs/model_config.py",
    "0.5.18": TAG.format("0.5.18") + "configs/model_config.py",
    "0.5.19": TAG.format("0.5.19") + "configs/model_config.py#L2115",
    "0.5.21": TAG.format("0.5.21") + "configs/model_config.py#L2454",
    "0.5.22": TAG.format("0.5.22") + "configs/model_config.py",
    "0.5.23": TAG.format("0.5.23") + "configs/model_config.py#L2651",
}


def listed_at(newest: frozenset[str], since: dict[str, str], release: str) -> frozenset[str]:
    """The architectures of a list that only grew (`newest`, as 0.5.23 has it) already on it at `release`."""
    return frozenset(arch for arch in newest if arch not in since or key(since[arch]) <= key(release))


def hybrid_swa_archs(release: str) -> frozenset[str]:
    """The architectures on `release`'s hybrid-SWA allow-list."""
    return listed_at(archs.HYBRID_SWA_ARCHS, HYBRID_SWA_SINCE, release)


# DeepSeek-V4's pool cell (DSV4PoolConfigurator, engines/sglang/dsv4.py): from 0.5.21 each row is priced as a padded
# FlashMLA page (`_get_paged_kv_bytes_per_token`) and the ratio-4 state ring per 256-token page; 0.5.15-0.5.20 price
# the raw 584-byte row and the ring per `window_size` (128) SWA slots, so 8% fewer full-pool tokens (the same
# 40 GiB pools in every goldens file 0.5.15-0.5.20: DeepSeek-V4-Flash 5,221,376, 0.5.21's 5,677,312).
DSV4_PAGED_ROWS: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.5.21", source=TAG.format("0.5.20") + "model_executor/pool_configurator.py#L1106-L1129"),
    Ranged(True, since="0.5.21", source=TAG.format("0.5.21") + "model_executor/pool_configurator.py#L1223-L1253"),
)

# The sparse-attention (DSA) models' full-pool cell in the default configurator (`_compute_cell_size`): up to 0.5.16 an
# MLA row is priced as kv_lora_rank + rope values of the KV dtype (576 bytes in fp8), from 0.5.17 as
# `calculate_mla_kv_cache_dim` gives it (fp8: the scaled row with a bf16 rope part, 656 bytes), as the pool is built
# at every release. Seen in 0.5.15's and 0.5.16's own sizing (goldens/sglang_check-0.5.16.json: DeepSeek-V3.2 with fp8
# KV 994,432 tokens at 40 GiB, 893,504 from 0.5.17) and in set 14's (goldens/heldout-rel5/sglang_check-0.5.15.json:
# GLM-5's fp8 cell 49,920 bytes, 56,160 at 0.5.17); 0.5.15's lines are pool_configurator.py:184-188.
DSA_SCALED_ROW_PRICED: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.5.17", source=TAG.format("0.5.16") + "model_executor/pool_configurator.py#L187-L192"),
    Ranged(True, since="0.5.17", source=TAG.format("0.5.17") + "model_executor/pool_configurator.py#L199-L212"),
)
# ... and its indexer keys: up to 0.5.17 one per layer; from 0.5.18 none on a layer that reuses another's top-k
# (`dsa_layer_skips_topk`). Seen in 0.5.17's own sizing (GLM-5.2, 21 of 78 layers indexing: 428,800 tokens at 40 GiB
# in bf16 up to 0.5.17, 463,616 from 0.5.18).
DSA_INDEX_SKIPS_PRICED: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.5.18", source=TAG.format("0.5.17") + "model_executor/pool_configurator.py#L242"),
    Ranged(True, since="0.5.18", source=TAG.format("0.5.18") + "model_executor/pool_configurator.py#L376-L412"),
)

# architecture -> the first release whose `_MAMBA_EXTRA_BUFFER_ARCHS` (arg_groups/overrides.py) lists it, where
# that is after 0.5.15 (absent: listed in every profiled release); read from each release's wheel. The list only
# grew. KimiLinear joined in 0.5.16 (0.5.15's list, overrides.py:982-995, lacks it; 0.5.16's L1135 has it): at
# 0.5.15 its `auto` strategy is no_buffer, 3 state slots per request and no overlap scheduler (sglang-0.5.15.json).
EXTRA_BUFFER_SINCE: dict[str, str] = {
    "KimiLinearForCausalLM": "0.5.16",
    "KimiK3ForConditionalGeneration": "0.5.17",
    "BailingMoeV3ForCausalLM": "0.5.19", "Qwen3_5ForCausalLM": "0.5.19", "Qwen3_5MoeForCausalLM": "0.5.19",
    "Glm5NextForConditionalGeneration": "0.5.20", "NemotronH_Omni_Reasoning_V3": "0.5.20",
    "Qwen4ExpForConditionalGeneration": "0.5.20",
    "BailingMoeV3VLForConditionalGeneration": "0.5.21", "InklingForConditionalGeneration": "0.5.21",
    "InklingForConditionalGenerationMTP": "0.5.21",
    "MiniCPMV4_7ForConditionalGeneration": "0.5.23",
}
# _MAMBA_EXTRA_BUFFER_ARCHS at each tag where the list changed
EXTRA_BUFFER_SOURCES = {
    "0.5.15": TAG.format("0.5.15") + "arg_groups/overrides.py#L982",
    "0.5.16": TAG.format("0.5.16") + "arg_groups/overrides.py#L1133",
    "0.5.17": TAG.format("0.5.17") + "arg_groups/overrides.py#L1432",
    "0.5.19": TAG.format("0.5.19") + "arg_groups/overrides.py#L519",
    "0.5.20": TAG.format("0.5.20") + "arg_groups/overrides.py#L474",
    "0.5.21": TAG.format("0.5.21") + "arg_groups/overrides.py#L378",
    "0.5.23": TAG.format("0.5.23") + "arg_groups/overrides.py#L403",
}


def extra_buffer_archs(release: str) -> frozenset[str]:
    """The architectures whose `--mamba-radix-cache-strategy auto` may resolve to `extra_buffer` at `release`."""
    return listed_at(archs.EXTRA_BUFFER_ARCHS, EXTRA_BUFFER_SINCE, release)


# The Mamba state pool's padding slot: from 0.5.17 the configurator charges it, solving K state slots as
# (budget - per_req) // per_req and taking (K + 1) slots from the memory left for tokens; up to 0.5.16 it solves
# budget // per_req and takes K (`_handle_max_mamba_cache`; 0.5.15's lives in ModelRunner's mixin). Seen in
# 0.5.16's own sizing (goldens/sglang-0.5.16.json: Qwen3-Next holds one state slot more than at 0.5.17).
MAMBA_PADDING_SLOT: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.5.17", source=TAG.format("0.5.16") + "mem_cache/kv_cache_configurator.py#L1789"),
    Ranged(True, since="0.5.17", source=TAG.format("0.5.17") + "mem_cache/kv_cache_configurator.py#L1954"),
)

# The SWA pool's admission floor: from 0.5.16 the hybrid-SWA pool configurator refuses an SWA pool that cannot hold
# sliding_window_size + page_size tokens ("SWA pool (N tokens) cannot hold even one request: ..."); 0.5.15's
# `_solve_pool_sizes` has no such check and sizes the pools. Seen in 0.5.15's own sizing (goldens/sglang-0.5.15.json:
# gpt-oss-20b at a 1 MiB budget, at 32 MiB and at --max-total-tokens 1000 with --swa-full-tokens-ratio 0.1).
SWA_ADMISSION_FLOOR: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.5.16", source=TAG.format("0.5.15") + "model_executor/pool_configurator.py#L374-L387"),
    Ranged(True, since="0.5.16", source=TAG.format("0.5.16") + "model_executor/pool_configurator.py#L428-L436"),
)

# The memory SGLang holds back from its pools (fit's SGLang model, engines/sglang/reserve.py): from 0.5.0 a
# formula of the GPU's memory, the chunked-prefill size and the decode graphs (srt/arg_groups/memory_hook.py
# at 0.5.23; server_args.py before), a fraction by TP size before it; breakable prefill CUDA graphs on CUDA
# reserved from 0.5.15 (the earliest release read: model_executor/cuda_graph_config.py default_prefill_backend).
RESERVE_SINCE = "0.5.0"
PREFILL_GRAPHS_SINCE = "0.5.15"
# The 20-35 GiB row (A10, RTX 4090/5090): 4096-token chunks and 48 / 160 decode graphs from 0.5.20, 2048 and 24 / 80
# before (arg_groups/memory_hook.py:100-120 @ 0.5.20; :74-90 @ 0.5.19; server_args.py:4837-4846 @ 0.5.18)
MID_GPU_ROW_SINCE = "0.5.20"
# KDA hybrids' prefill graphs off (arg_groups/cuda_graph_hook.py disable_breakable_cudagraph_if_incompatible: the
# rule is in 0.5.20's, not in 0.5.19's)
KDA_GRAPHS_OFF_SINCE = "0.5.20"

# Exaone-4 with sliding layers (a `sliding_window_pattern`, transformers' class default 4): SGLang's model hook
# asserts the attention backend is one of fa3 / triton / trtllm_mha (arg_groups/model_hook.py). Up to 0.5.21 it
# reads the backend before the server has resolved its default, so a server started without --attention-backend
# stops with "... but got None"; from 0.5.22 the default (fa3 on Hopper) is resolved first and it starts. Seen in
# each release's own start-up (goldens/sglang_check-<release>.json, EXAONE-4.0-32B).
EXAONE_BACKEND_ARCHS = frozenset({"Exaone4ForCausalLM", "ExaoneMoEForCausalLM"})
EXAONE_BACKENDS = ["fa3", "triton", "trtllm_mha"]
EXAONE_BACKEND_UNRESOLVED: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.5.22", source=TAG.format("0.5.21") + "arg_groups/model_hook.py#L634"),
    Ranged(False, since="0.5.22", source=TAG.format("0.5.22") + "arg_groups/model_hook.py#L673"),
)

# ModelConfig reads the text config's `num_attention_heads` as an attribute up to 0.5.19, so a configuration class
# that has none (transformers' Mamba2Config, FalconMambaConfig: attention-free) stops the server there with
# AttributeError; from 0.5.20 it is read with a None default (pure SSMs get attention_arch SSM). Seen in each
# release's own start-up (goldens/heldout-rel3/sglang_check-<release>.json: Mamba-Codestral, Falcon-Mamba).
HEADS_READ_AS_ATTRIBUTE: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.5.20", source=TAG.format("0.5.19") + "configs/model_config.py#L1077"),
    Ranged(False, since="0.5.20", source=TAG.format("0.5.20") + "configs/model_config.py#L1261-L1263"),
)

# MiniMax-M3's sparse pool (`MiniMaxSparseKVPool`, archs.MINIMAX_SPARSE_ARCHS): its cell in the pool configurator
# (model_executor/pool_configurator.py, the `is_minimax_sparse` branch) is the same at 0.5.21, 0.5.22 and 0.5.23 but
# for the Blackwell-only NVFP4 stack; before 0.5.21 it is written otherwise (not read): budgets stay unpriced there.
MINIMAX_SPARSE_SIZED_SINCE = "0.5.21"
# Its index key's dtype (`get_minimax_sparse_index_dtype`, mem_cache/memory_pool.py): the model dtype, except in
# fp8 attention-GEMM mode (SM100 only); from 0.5.23 also the KV dtype for fp8_e4m3 KV on Hopper (sm90).
MINIMAX_INDEX_FP8_ON_HOPPER: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.5.23", source=TAG.format("0.5.22") + "mem_cache/memory_pool.py#L5703"),
    Ranged(True, since="0.5.23", source=TAG.format("0.5.23") + "mem_cache/memory_pool.py#L5831"),
)
# MiniMax-M3 on Hopper: with neither --attention-backend nor --page-size given, the model override picks fa3 and a
# page of 128 (arg_groups/overrides.py `_minimax_m3_overrides` from 0.5.16, model_overrides/minimax_m3.py from
# 0.5.19); 0.5.15 has no such override.
MINIMAX_PAGE_128_SINCE = "0.5.16"

# DeepSeek-V4 with hybrid-SWA memory off: the default pool configurator gives no SWA pool size (None) and
# DeepSeekV4TokenToKVPool's SWA ring adds a page to it (`_num_dsv4_physical_kv_pages`): TypeError while the pools are
# built, after the sizing. Seen in 0.5.23's own start-up (goldens/sglang_check.json, DeepSeek-V4-Flash and -Pro);
# the same function and call at 0.5.21 and 0.5.22; earlier releases not read.
DSV4_NO_SWA_SIZE_SINCE = "0.5.21"
DSV4_NO_SWA_SIZE_SOURCES = {
    "0.5.21": TAG.format("0.5.21") + "mem_cache/deepseek_v4_memory_pool.py#L132",
    "0.5.22": TAG.format("0.5.22") + "mem_cache/deepseek_v4_memory_pool.py#L136",
    "0.5.23": TAG.format("0.5.23") + "mem_cache/deepseek_v4_memory_pool.py#L171",
}


# Multimodal architectures whose prefill graphs stay on, by the first release that lists them
# (configs/model_config.py multimodal_breakable_cuda_graph_supported_model_archs: :2501-2516 @ 0.5.23; read in each
# release's wheel from 0.5.15, which lists none)
BREAKABLE_MULTIMODAL = {
    "Qwen3_5ForConditionalGeneration": "0.5.16", "Qwen3_5MoeForConditionalGeneration": "0.5.16",
    "InternS2MobiusForConditionalGeneration": "0.5.18", "KimiK25ForConditionalGeneration": "0.5.18",
    "KimiK3ForConditionalGeneration": "0.5.18", "MuseGlimmerForConditionalGeneration": "0.5.18",
    "Cohere2VisionForConditionalGeneration": "0.5.19", "PaddleOCRVLForConditionalGeneration": "0.5.19",
    "Glm5NextForConditionalGeneration": "0.5.20", "MiniMaxM3SparseForCausalLM": "0.5.22",
    "MiniMaxM3SparseForConditionalGeneration": "0.5.22", "Qwen4ExpForConditionalGeneration": "0.5.22",
    "MuseSparkForConditionalGeneration": "0.5.23",
}
