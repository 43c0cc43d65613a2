"""What changes in vLLM's KV layout, refusals and sizing between the profiled releases (0.26.0 to 0.34.0),
as values with a release range; each is read from the code at both tags (`vllm/...` at vX.Y.Z on GitHub,
the same files as in that release's wheel on PyPI) and cited so.

The profile, the refusals and the budget ask `at(TABLE, release)`; nothing else in the vLLM package
names a release other than the pinned one.
"""
from __future__ import annotations

from kvdoctor.engines.releases import Ranged

TAG = "https://github.com/vllm-project/vllm/blob/v{}/vllm/"


def src(version: str, path: str) -> str:
    return TAG.format(version) + path


# CacheConfig.DEFAULT_BLOCK_SIZE: the block FlashAttention / FlashAttention-MLA keep unless --block-size is given
# (they take any multiple of 16, so Platform._preferred_block_size_for_backends returns the default).
DEFAULT_BLOCK: tuple[Ranged[int], ...] = (
    Ranged(16, until="0.34.0", source=src("0.33.0", "config/cache.py#L185")),
    Ranged(64, since="0.34.0", source=src("0.34.0", "config/cache.py#L185")),
)

# gpu_memory_utilization when unset: 0.92, then (0.34.0) 1.0 with the extensible KV cache that 0.34.0 turns on by
# default on CUDA (`resolved_gpu_memory_utilization`), sizing the cache from memory measured after CUDA graphs.
GPU_UTILIZATION: tuple[Ranged[float], ...] = (
    Ranged(0.92, until="0.34.0", source=src("0.33.0", "config/cache.py#L215")),
    Ranged(1.0, since="0.34.0", source=src("0.34.0", "config/cache.py#L216-L234")),
)

# How the KV memory is found when neither `enable_extensible_kv_cache: false` nor kv_cache_memory_bytes is given:
# up to 0.33 estimated from the profiling run (`requested - non_kv_cache_memory - CUDA graph estimate`); from 0.34.0
# measured (the extensible KV cache, on by default on CUDA and ROCm: `_resolve_extensible_kv_cache`), its address
# range reserved at that estimate and its pages committed after warm-up and CUDA graph capture from the memory then
# free, less a headroom (`measure_kv_cache_bytes`). kvdoctor.engines.vllm.fit prices both.
EXTENSIBLE_KV_CACHE: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.34.0", source=src("0.33.0", "v1/worker/gpu_worker.py")),
    Ranged(True, since="0.34.0", source=src("0.34.0", "config/vllm.py#L3180-L3254")),
)

# The measured sizing's headroom on CUDA, as (floor, share of the transient peak): the margin is
# max(1 GiB, 0.75 x transient), and the transient itself is kept free on top of it (3 GiB floor on ROCm). Before
# 0.34.0 there is no measured sizing, so no margin.
EXTENSIBLE_MARGIN: tuple[Ranged[tuple[int, float]], ...] = (
    Ranged((0, 0.0), until="0.34.0", source=src("0.33.0", "v1/worker/gpu_worker.py")),
    Ranged((1 << 30, 0.75), since="0.34.0", source=src("0.34.0", "v1/worker/extensible_kv_cache.py#L64-L65")),
)

# Grouping: from 0.27 layers of one spec type whose specs merge (full-attention layers that differ only in their
# window or chunk) share a bucket before groups are sized (`layer_buckets` in
# _get_kv_cache_groups_uniform_page_size); 0.26.0 kept one bucket per distinct spec.
MERGE_COMPATIBLE_SPECS: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.27.0", source=src("0.26.0", "v1/core/kv_cache_utils.py#L1208-L1234")),
    Ranged(True, since="0.27.0", source=src("0.27.1", "v1/core/kv_cache_utils.py#L1212-L1232")),
)

# Hybrid manager off: from 0.27 a promoted sliding / chunked spec takes the full-attention layers' block size
# (`full_attention_block_size` in _promote_local_kv_cache_specs); 0.26.0 kept each layer's own.
PROMOTED_TAKE_FULL_BLOCK: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.27.0", source=src("0.26.0", "v1/core/kv_cache_utils.py#L1429-L1522")),
    Ranged(True, since="0.27.0", source=src("0.27.1", "v1/core/kv_cache_utils.py#L1446-L1529")),
)

# Hybrid manager off with DeepSeek-V4's SlidingWindowMLASpecs: from 0.31.0 to 0.33.0 promoting them to
# MLAAttentionSpec carries `bounded_replay` over (`replace_as`), which MLAAttentionSpec does not take: TypeError
# (VLM152, in the 0.31.0, 0.32.0 and 0.33.0 goldens). The start-up goldens of 0.30.0 and 0.34.0 get past it (to the
# admission check).
SLIDING_MLA_PROMOTION_FAILS: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.31.0", source=src("0.30.0", "v1/kv_cache_interface.py")),
    Ranged(True, since="0.31.0", until="0.34.0", source=src("0.31.0", "v1/kv_cache_interface.py#L129")),
    Ranged(False, since="0.34.0", source=src("0.34.0", "v1/kv_cache_interface.py")),
)
# DeepSeek-V4's caches as kvdoctor.engines.vllm.dsv4 plans them: the goldens of 0.30.0 to 0.34.0
# hold the same 167 (Flash) and 243 (Pro) specs, groups and admission sizes; 0.28.0's start-up is not recorded
# (the CPU box runs out of memory first), so before 0.30.0 it stays with --dry-run (VLM024)
DSV4_PLANNED: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.30.0", source=src("0.28.0", "v1/kv_cache_interface.py")),
    Ranged(True, since="0.30.0", source=src("0.34.0", "models/deepseek_v4/attention.py#L817-L881")),
)

# DeepSeek-V4's compression per layer: up to 0.32.0 its attention reads `compress_ratios[layer_id]` off the config
# (models/deepseek_v4/attention.py:228 at 0.30.0, :233 at 0.31.0 and 0.32.0), whatever `layer_types` says; from
# 0.33.0 it reads `compress_rates[layer_types[layer_id]]` (:239-240 at 0.33.0, :240-241 at 0.34.0). Held-out set 15
# at 0.31.0: every layer typed sliding, which 0.31.0 still compresses as the ratios say.
DSV4_READS_COMPRESS_RATIOS: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.33.0", source=src("0.32.0", "models/deepseek_v4/attention.py#L233")),
    Ranged(False, since="0.33.0", source=src("0.33.0", "models/deepseek_v4/attention.py#L239-L240")),
)

# A Mamba model (an IsHybrid class, or MODELS_CONFIG_MAP's attention-free Mamba classes) with prefix caching on
# asserts chunked prefill in MambaModelConfig.verify_and_update_config (VLM209), worded per release; None: not read
# (0.26.0 asserts only once its mamba_cache_mode resolved to 'align', which the profile does not follow).
MAMBA_CACHING_CHUNKED_PREFILL_TEXT: tuple[Ranged[str | None], ...] = (
    Ranged(None, until="0.32.0", source=src("0.26.0", "model_executor/models/config.py#L579-L582")),
    Ranged("Chunked prefill is required for mamba cache mode 'align'.", since="0.32.0", until="0.33.0",
           source=src("0.32.0", "model_executor/models/config.py#L694-L696")),
    Ranged("Chunked prefill is required for Mamba prefix caching.", since="0.33.0",
           source=src("0.34.0", "model_executor/models/config.py#L1103-L1105")),
)

# Gemma-4's head size: up to 0.27.1 Gemma4ModelArchConfigConvertor.get_head_size reads `head_dim` off the text
# config, which the transformers of those releases' day (5.18.0 for 0.27.1; the venvs' 5.25.0 for 0.26.0) declares a
# per-layer attribute of Gemma-4's heterogeneous config and refuses to give globally (VLM250, read in the 0.26.0,
# 0.27.0 and 0.27.1 wheels); from 0.28.0 vLLM reads each layer's config (`per_layer_config`).
GEMMA4_GLOBAL_HEAD_DIM: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.28.0", source=src("0.27.1", "transformers_utils/model_arch_config_convertor.py#L604-L610")),
    Ranged(False, since="0.28.0", source=src("0.28.0", "transformers_utils/model_arch_config_convertor.py#L694-L720")),
)

# Qwen3.5 configs (`qwen3_5`, `qwen3_5_moe` and their `_text` types): up to 0.31.0 vLLM reads them with its own
# classes (its _CONFIG_REGISTRY), whose text config calls PretrainedConfig.validate_layer_type from __init__ - in the
# venvs' transformers (5.17.0-5.18.0) a plain ValueError, which ModelConfig's pydantic wrapper reports as a
# ValidationError - where from 0.32.0 transformers' strict dataclass runs the validator
# (StrictDataclassClassValidationError). Held-out set 15 at 0.29.0: `layer_types` one short or cut to half.
QWEN3_5_OWN_CONFIG: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.32.0", source=src("0.31.0", "transformers_utils/configs/qwen3_5_moe.py#L107")),
    Ranged(False, since="0.32.0", source=src("0.32.0", "transformers_utils/config.py")),
)

# Hybrid block alignment (Platform._align_hybrid_block_size): from 0.27.0 an MLA + Mamba hybrid keeps its block a
# multiple of 128 (TRTLLM / FlashInfer MLA decode kernels); 0.26.0 aligns it to the backend's kernel block alone.
MLA_HYBRID_UNIT: tuple[Ranged[int], ...] = (
    Ranged(0, until="0.27.0", source=src("0.26.0", "platforms/interface.py#L874-L881")),
    Ranged(128, since="0.27.0", source=src("0.27.1", "platforms/interface.py#L876-L888")),
)

# KDA's (Kimi-Linear's) conv state holds the speculative tokens too from 0.27.0 (`conv_kernel_size - 1 + num_spec`
# in MambaStateShapeCalculator.kda_state_shape); 0.26.0 sizes it for the kernel alone.
KDA_CONV_HOLDS_SPEC_TOKENS: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.27.0", source=src("0.26.0", "model_executor/layers/mamba/mamba_utils.py#L237-L260")),
    Ranged(True, since="0.27.0", source=src("0.27.1", "model_executor/layers/mamba/mamba_utils.py#L271-L294")),
)

# The concurrency vLLM logs ("Maximum concurrency for N tokens per request"): 0.26.0 divides the pool by
# cdiv(sum of the groups' bytes at max_model_len, the first group's page); from 0.27 by the sum over groups of
# cdiv(group bytes, group page) (get_max_concurrency_for_kv_cache_config).
CONCURRENCY_PER_GROUP: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.27.0", source=src("0.26.0", "v1/core/kv_cache_utils.py#L937-L955")),
    Ranged(True, since="0.27.0", source=src("0.27.1", "v1/core/kv_cache_utils.py#L937-L959")),
)

# The admission check (one request at max_model_len must fit): from 0.29.0 it holds back the null block the block
# pool keeps for itself ("Reserve the null block BlockPool permanently holds back"); up to 0.28 it checks the whole
# budget. Seen in goldens/vllm-0.28.0.json: "available KV cache memory (4.0 GiB)" where 0.29.0 on says 3.99.
ADMISSION_RESERVES_NULL_BLOCK: tuple[Ranged[bool], ...] = (
    Ranged(False, until="0.29.0", source=src("0.28.0", "v1/core/kv_cache_utils.py#L854-L859")),
    Ranged(True, since="0.29.0", source=src("0.29.0", "v1/core/kv_cache_utils.py#L975-L980")),
)

# The Transformers modeling backend (an architecture vLLM's registry lacks and transformers exports) builds an Attention
# for every text layer with the model's KV heads and head size, windowed where the *top-level* config's `layer_types`
# says sliding_attention (`self.config`, not `self.text_config`: a composite config keeps them in text_config, so its
# layers get no window of their own). Read in 0.26.0's and 0.27.0's wheels (base.py L522-L577 and L521-L576); later
# releases' backend is not modelled (0.34.0's reads the text config and builds linear-attention layers too): those
# models are left to --dry-run. Found by 0.26.0's start-up goldens: Muse-Glimmer-30B, 52 full-attention layers.
TRANSFORMERS_BACKEND_PLANNED: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.27.1", source=src("0.26.0", "model_executor/models/transformers/base.py#L522-L577")),
    Ranged(False, since="0.27.1", source=src("0.34.0", "model_executor/models/transformers/base.py")),
)

# The refusal when the hybrid manager is off and the specs do not unify (MEM002 / VLM004).
PROMOTION_FAILED: tuple[Ranged[str], ...] = (
    Ranged("Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified type.",
           until="0.27.0", source=src("0.26.0", "v1/core/kv_cache_utils.py#L1519")),
    Ranged("Failed to promote local KV cache specs to one unified type.", since="0.27.0",
           source=src("0.27.1", "v1/core/kv_cache_utils.py#L1529")),
)

# What the two memory refusals tell the user to do: 0.34.0 words it per sizing mode (`_more_kv_cache_memory_hint`);
# with a KV budget given (kv_cache_memory_bytes) the extensible cache is off and the hint is the older one, less
# its "or decreasing max_model_len" tail, which moved after it.
# (ESTIMATE_HINT: the estimated sizing's advice; vllm.fit words the extensible cache's own, `extensible_hint`.)
ESTIMATE_HINT = ("Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
         "reservation on the CPU backend, despite its name).")
_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
NO_MEMORY: tuple[Ranged[str], ...] = (
    Ranged(f"No available memory for the cache blocks. {ESTIMATE_HINT} {_DOCS}", until="0.34.0",
           source=src("0.33.0", "v1/core/kv_cache_planning.py#L57")),
    Ranged(f"No available memory for the cache blocks. {ESTIMATE_HINT} {_DOCS}", since="0.34.0",
           source=src("0.34.0", "v1/core/kv_cache_planning.py#L64-L117")),
)
ADMISSION_TAIL: tuple[Ranged[str], ...] = (
    Ranged("Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
           f"decreasing `max_model_len` when initializing the engine. {_DOCS}", until="0.34.0",
           source=src("0.33.0", "v1/core/kv_cache_planning.py#L77")),
    Ranged(f"{ESTIMATE_HINT} Decreasing `max_model_len` also reduces what is needed. {_DOCS}", since="0.34.0",
           source=src("0.34.0", "v1/core/kv_cache_planning.py#L124")),
)

# Where each refusal is raised, per release (the raise statement's line, found by its message in each wheel): the
# planning half of kv_cache_utils.py moved to kv_cache_planning.py in 0.33.0.
_LINES: dict[str, dict[str, str]] = {
    "0.26.0": {"VLM006": "v1/core/kv_cache_utils.py#L758", "MEM004": "v1/core/kv_cache_utils.py#L778",
               "VLM010": "v1/core/kv_cache_utils.py#L1120", "MEM002": "v1/core/kv_cache_utils.py#L1519",
               "VLM008": "config/vllm.py#L1628", "VLM011": "config/vllm.py#L2285", "VLM012": "config/vllm.py#L2301",
               "MEM014": "config/model.py#L1231"},
    "0.27.0": {"VLM006": "v1/core/kv_cache_utils.py#L758", "MEM004": "v1/core/kv_cache_utils.py#L778",
               "VLM010": "v1/core/kv_cache_utils.py#L1123", "MEM002": "v1/core/kv_cache_utils.py#L1529",
               "VLM008": "config/vllm.py#L1667", "VLM011": "config/vllm.py#L2316", "VLM012": "config/vllm.py#L2332",
               "MEM014": "config/model.py#L1316"},
    "0.28.0": {"VLM006": "v1/core/kv_cache_utils.py#L738", "MEM004": "v1/core/kv_cache_utils.py#L758",
               "VLM010": "v1/core/kv_cache_utils.py#L1089", "MEM002": "v1/core/kv_cache_utils.py#L1482",
               "VLM008": "config/vllm.py#L1778", "VLM011": "config/vllm.py#L2536", "VLM012": "config/vllm.py#L2552",
               "MEM014": "config/model.py#L1368"},
    "0.29.0": {"VLM006": "v1/core/kv_cache_utils.py#L859", "MEM004": "v1/core/kv_cache_utils.py#L879",
               "VLM010": "v1/core/kv_cache_utils.py#L1190", "MEM002": "v1/core/kv_cache_utils.py#L1570",
               "VLM008": "config/vllm.py#L1840", "VLM011": "config/vllm.py#L2828", "VLM012": "config/vllm.py#L2844",
               "MEM014": "config/model.py#L1414"},
    "0.30.0": {"VLM006": "v1/core/kv_cache_utils.py#L879", "MEM004": "v1/core/kv_cache_utils.py#L899",
               "VLM010": "v1/core/kv_cache_utils.py#L1420", "MEM002": "v1/core/kv_cache_utils.py#L1880",
               "VLM008": "config/vllm.py#L2041", "VLM011": "config/vllm.py#L3188", "VLM012": "config/vllm.py#L3205",
               "MEM014": "config/model.py#L1427"},
    "0.31.0": {"VLM006": "v1/core/kv_cache_utils.py#L905", "MEM004": "v1/core/kv_cache_utils.py#L925",
               "VLM010": "v1/core/kv_cache_utils.py#L1438", "MEM002": "v1/core/kv_cache_utils.py#L1901",
               "VLM008": "config/vllm.py#L2279", "VLM011": "config/vllm.py#L3424", "VLM012": "config/vllm.py#L3441",
               "MEM014": "config/model.py#L1505"},
    "0.32.0": {"VLM006": "v1/core/kv_cache_utils.py#L1010", "MEM004": "v1/core/kv_cache_utils.py#L1030",
               "VLM010": "v1/core/kv_cache_utils.py#L1347", "MEM002": "v1/core/kv_cache_utils.py#L1760",
               "VLM008": "config/vllm.py#L2198", "VLM011": "config/vllm.py#L3296", "VLM012": "config/vllm.py#L3313",
               "MEM014": "config/model.py#L1547"},
    "0.33.0": {"VLM006": "v1/core/kv_cache_planning.py#L57", "MEM004": "v1/core/kv_cache_planning.py#L77",
               "VLM010": "v1/core/kv_cache_planning.py#L401", "MEM002": "v1/core/kv_cache_planning.py#L814",
               "VLM008": "config/vllm.py#L2285", "VLM011": "config/vllm.py#L3432", "VLM012": "config/vllm.py#L3449",
               "MEM014": "config/model.py#L1560", "VLM002": "config/model.py#L2680",
               "VLM007": "model_executor/models/qwen3_next.py#L518", "VLM009": "model_executor/models/qwen2.py#L352",
               "VLM032": "transformers_utils/config.py#L445", "VLM142": "model_executor/models/llama.py#L151",
               "VLM139": "model_executor/models/registry.py#L1249", "VLM140": "model_executor/models/registry.py#L1234",
               "VLM141": "model_executor/models/registry.py#L1243"},
    "0.34.0": {"VLM006": "v1/core/kv_cache_planning.py#L107", "MEM004": "v1/core/kv_cache_planning.py#L124",
               "VLM010": "v1/core/kv_cache_planning.py#L447", "MEM002": "v1/core/kv_cache_planning.py#L854",
               "VLM008": "config/vllm.py#L2206", "VLM011": "config/vllm.py#L3574", "VLM012": "config/vllm.py#L3591",
               "MEM014": "config/model.py#L1580"},
}
_LINES["0.26.0"]["VLM250"] = "transformers_utils/model_arch_config_convertor.py#L597"
_LINES["0.27.0"]["VLM250"] = "transformers_utils/model_arch_config_convertor.py#L608"
for _release, _line in (("0.26.0", 199), ("0.27.0", 199), ("0.30.0", 192)):
    _LINES[_release]["VLM291"] = f"model_executor/models/afmoe.py#L{_line}"
_LINES["0.27.1"] = _LINES["0.27.0"]
_LINES["0.34.0"]["VLM004"] = _LINES["0.34.0"]["MEM002"]
# VLM152 (SLIDING_MLA_PROMOTION_FAILS) is raised only by 0.31.0 to 0.33.0, in replace_as
_LINES["0.31.0"]["VLM152"] = "v1/kv_cache_interface.py#L129"
_LINES["0.32.0"]["VLM152"] = "v1/kv_cache_interface.py#L138"
_LINES["0.33.0"]["VLM152"] = "v1/kv_cache_interface.py#L175"
_LINES["0.32.0"]["VLM209"] = "model_executor/models/config.py#L694"
_LINES["0.33.0"]["VLM209"] = "model_executor/models/config.py#L773"
for _release, _line in (("0.26.0", 289), ("0.32.0", 319), ("0.33.0", 320)):
    _LINES[_release]["VLM261"] = f"model_executor/layers/mamba/mamba_mixer2.py#L{_line}"
for _lines in _LINES.values():
    _lines.setdefault("VLM004", _lines["MEM002"])


def source(code: str, release: str, pinned: str) -> str:
    """Where `release` raises the refusal `code`: its own line where this table has it, else `pinned`'s
    (the catalog's citation)."""
    path = _LINES.get(release, {}).get(code)
    return src(release, path) if path else pinned


# MXFP4 experts (gpt-oss): the MoE kernel vLLM picks for the GPU pads each expert's hidden size and its
# per-rank intermediate size to its tile, and the loaded tensors take the padded shapes. At 0.33.0
# (fused_moe/oracle/mxfp4.py, mxfp4_round_up_hidden_size_and_intermediate_size, and the gpt-oss backend
# order of _get_priority_backends_for_gpt_oss): Hopper gets the Triton kernels (intermediate to 64),
# Ampere and Ada Marlin (hidden to 256, intermediate to 128), datacenter Blackwell FlashInfer's TRT-LLM
# kernels (256, 128). Older Hopper releases padded more; those two rows are fitted to the calibration logs'
# weights of gpt-oss on H100 (0.10.1: 65.97 GiB, 0.11.0: 64.38 GiB for gpt-oss-120b), not read.
# (hidden, intermediate) alignment by compute-capability class
MXFP4_ALIGN: tuple[Ranged[dict[str, tuple[int, int]]], ...] = (
    Ranged({"hopper": (256, 128), "ampere": (256, 128), "blackwell": (256, 128)}, until="0.11.0",
           source="calibrated: tests/data/startup-logs/vllm-0.10.1-gpt-oss-120b-h100-refused.yaml"),
    Ranged({"hopper": (256, 64), "ampere": (256, 128), "blackwell": (256, 128)}, since="0.11.0", until="0.33.0",
           source="calibrated: tests/data/startup-logs/vllm-0.11-gpt-oss-120b-h100-tp1.yaml; the release between "
                  "0.14.1 and 0.33.0 that stopped padding Hopper's hidden size was not read"),
    Ranged({"hopper": (1, 64), "ampere": (256, 128), "blackwell": (256, 128)}, since="0.33.0",
           source=src("0.33.0", "model_executor/layers/fused_moe/oracle/mxfp4.py#L837-L920")),
)
