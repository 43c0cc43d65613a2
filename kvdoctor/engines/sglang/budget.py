"""SGLang 0.5.23 (CUDA path): how the memory left after weights becomes token pools and state slots.

The CUDA path matters for hybrid state models: there `auto` resolves the Mamba radix-cache strategy to
`extra_buffer`, so a request holds 5 state slots (3 + 2 ping-pong tracking slots), not the 3 of the
CPU path (goldens/sglang.json is generated on the CUDA platform path).

Order as in `KVCacheConfigurator`: Mamba/linear state slots come first (`_handle_max_mamba_cache`,
in GB floats), the rest becomes the token pool (default, hybrid SWA, or SWA sized from a request
cap), the user's token cap applies, then `resolve_max_num_reqs`. File:line references are to the
sglang 0.5.23 wheel (`srt/`).
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import replace

from kvdoctor.engines.budget.common import (Budget, BudgetView, EngineRefusal, GiB, MiB, Record, StateTensor, n,
                                            size)
from kvdoctor.engines.budget.facts import Layer, ModelFacts, dtype_bytes
from kvdoctor.engines.budget.run import default_context, kv_memory
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import at, key
from kvdoctor.engines.sglang import dsv4
from kvdoctor.engines.sglang.archs import PURE_SSM_ARCHS
from kvdoctor.engines.sglang.releases import (DSA_FP8_SCALED_CELL, DSV4_SIZED_SINCE, MAMBA_PADDING_SLOT, MINIMAX_INDEX_FP8_ON_HOPPER,
                                              MINIMAX_SPARSE_SIZED_SINCE, SWA_ADMISSION_FLOOR, extra_buffer_archs,
                                              hybrid_swa_archs)
from kvdoctor.errors import InputError
from kvdoctor.model import SPARSE_MLA

if TYPE_CHECKING:
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.sglang.settings import SglangSettings
    from kvdoctor.model import ModelSpec

VERSION = PINS["sglang"]
MAMBA_SLOTS_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO with the radix cache on
# With the `extra_buffer` Mamba radix-cache strategy each request also holds ping-pong tracking slots:
# 2 with the overlap scheduler, 1 without (mem_cache/allocation_sizing.py:11 get_mamba_tracking_slots).
EXTRA_BUFFER_SLOTS = {True: 2, False: 1}
SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL default
FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_e5m2")
# Model classes whose get_attention_sliding_window_size reports sliding_window - 1 (models/*.py);
# SGLang's SWA floor and request cap use that value.
WINDOW_MINUS_ONE = frozenset({"GptOssForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
                              "Gemma3ForConditionalGeneration"})
REFS = {
    "mamba": "srt/mem_cache/kv_cache_configurator.py:3229-3409",
    "state_bytes": "srt/configs/mamba_utils.py:116",
    "ssm_dtype": "srt/configs/mamba_utils.py:46-100",
    "default_pool": "srt/model_executor/pool_configurator.py:219-653",
    "hybrid_swa": "srt/model_executor/pool_configurator.py:656-921",
    "swa_floor": "srt/model_executor/pool_configurator.py:198-216",
    "request_cap": "srt/model_executor/pool_configurator.py:924-1046",
    "max_running": "srt/mem_cache/kv_cache_configurator.py:3119-3172",
    "mamba_ratio": "srt/mem_cache/kv_cache_configurator.py:3062-3088",
    "mamba_strategy": "srt/arg_groups/overrides.py:403-486",
    "allow_list": "srt/configs/model_config.py:2651",
    "window": "srt/model_executor/model_runner_components/load_model_utils.py:144-157",
}


class Mode(msgspec.Struct, frozen=True):
    """The server arguments SGLang's pool sizing reads, with its defaults."""

    context_length: int
    kv_budget_bytes: int
    page_size: int = 1  # no static default: the attention backend resolves it (FA3: 1, FlashMLA: 64)
    swa_full_tokens_ratio: float = 0.8
    swa_ratio_set: bool = False  # the deployer gave --swa-full-tokens-ratio (DeepSeek-V4's hook sets it otherwise)
    disable_hybrid_swa_memory: bool = False
    kv_cache_dtype: str = "auto"
    tp: int = 1
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float = 0.9
    mamba_ssm_dtype: str | None = None  # None: the config's mamba_ssm_dtype, else float32
    radix_cache: bool = True
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int = 8192
    overlap_schedule: bool = True
    release: str = VERSION  # the SGLang release sized (what differs: kvdoctor.engines.sglang.releases)


class ModeRecord(Record, kw_only=True):
    context_length: int
    page_size: int
    kv_cache_dtype: str
    tp: int
    hybrid_swa: bool  # a separate SWA pool
    radix_cache: bool
    max_running_requests: int | None
    max_total_tokens: int | None
    # the knobs of a model with sliding layers
    swa_full_tokens_ratio: float | UnsetType = UNSET
    disable_hybrid_swa_memory: bool | UnsetType = UNSET
    # the knobs of a model with recurrent state
    mamba_ssm_dtype: str | UnsetType = UNSET
    mamba_full_memory_ratio: float | UnsetType = UNSET
    max_mamba_cache_size: int | None | UnsetType = UNSET
    configurator: str | UnsetType = UNSET  # the pool configurator that sized the pools


class LayerKindRecord(Record, kw_only=True):
    kind: str
    layers: int
    bytes_per_token_per_layer: int | list[int]  # a list where layers of the kind differ
    pool: str  # full | swa | state
    bytes_per_request_per_layer: int | UnsetType = UNSET  # state layers


class PoolRecord(Record, kw_only=True):
    pool: str  # full | swa
    tokens: int
    bytes_per_token: int


class StateRecord(Record, kw_only=True):
    kind: str
    slots: int | None
    bytes_per_slot: int
    slots_per_request: int
    bytes: int | None
    mamba_radix_cache_strategy: str | None
    ssm_dtype: str
    tensors: list[StateTensor]


class CapacityRecord(Record, kw_only=True):
    """Tokens are the pool's (`max_total_num_tokens`), shared by all running requests."""

    unit: str = "pool_tokens"
    context_length: int
    max_running_requests: int | UnsetType = UNSET
    max_total_num_tokens: int | UnsetType = UNSET
    concurrency_at_L: float | UnsetType = UNSET
    kv_budget_bytes: int
    max_context_fit: int | UnsetType = UNSET


class SglangBudget(Budget, kw_only=True):
    mode: ModeRecord
    capacity: CapacityRecord
    layer_kinds: list[LayerKindRecord] = []
    state: StateRecord | None = None
    pools: list[PoolRecord] | None = None

    def parts(self) -> tuple[ModeRecord, list[LayerKindRecord], StateRecord | None, CapacityRecord]:
        return self.mode, self.layer_kinds, self.state, self.capacity

    def layout_json(self) -> dict[str, Any]:
        return {} if self.pools is None else {"pools": [p.to_json() for p in self.pools]}


def kv_bytes(facts: ModelFacts, mode: Mode) -> int:
    if mode.kv_cache_dtype == "auto":
        return dtype_bytes(facts.serving_dtype)
    if mode.kv_cache_dtype in FP8_NAMES:
        return 1
    return dtype_bytes(mode.kv_cache_dtype)


def hybrid_swa(facts: ModelFacts, mode: Mode) -> bool:
    return bool(set(facts.architectures) & hybrid_swa_archs(mode.release)) and not mode.disable_hybrid_swa_memory


def ssm_dtype(facts: ModelFacts, mode: Mode) -> str:
    """--mamba-ssm-dtype, else the config's mamba_ssm_dtype (GDN models only), else float32."""
    if mode.mamba_ssm_dtype:
        return mode.mamba_ssm_dtype
    if facts.gdn and facts.config_ssm_dtype in ("float32", "bfloat16", "float16"):
        return facts.config_ssm_dtype
    return "float32"


def state_per_request(facts: ModelFacts, mode: Mode) -> tuple[int, list[StateTensor]]:
    """Bytes of one request's state over all linear layers: conv in bf16, SSM in the SSM dtype."""
    conv_b, ssm_b = 2, dtype_bytes(ssm_dtype(facts, mode))
    if facts.gdn:
        g = facts.gdn
        groups = g.key_heads
        if groups % mode.tp:
            groups += mode.tp - groups  # replicate groups so every head shard has its own
        conv = ((g.value_dim * g.value_heads + 2 * groups * g.key_dim) // mode.tp, g.conv_kernel - 1)
        ssm = (g.value_heads // mode.tp, g.value_dim, g.key_dim)
        layers = facts.count("gdn")
    elif facts.mamba:
        m = facts.mamba
        groups = m.n_groups
        if groups % mode.tp:
            groups += mode.tp - groups  # as for GDN: groups replicated up to the TP size
        conv = ((m.heads * m.head_dim + 2 * groups * m.state_size) // mode.tp, m.conv_kernel - 1)
        ssm = (m.heads // mode.tp, m.head_dim, m.state_size)
        layers = facts.count("mamba")
    elif facts.mamba1:  # Mamba-1 (configs/mamba.py): conv over the intermediate channels, a full-rank state
        j = facts.mamba1
        conv, ssm = (j.intermediate // mode.tp, j.conv_kernel - 1), (j.intermediate // mode.tp, 1, j.state_size)
        layers = facts.count("mamba")
    elif facts.short_conv:  # LFM2 (configs/lfm2.py): hidden channels, heads = TP ranks, no SSM state
        c = facts.short_conv
        conv, ssm = (c.conv_dim // mode.tp, c.conv_kernel - 1), (1, c.conv_dim, 0)
        layers = facts.count("short_conv")
    else:
        k = facts.kda
        conv = (k.conv_kernel - 1, 3 * (k.heads * k.head_dim // mode.tp))
        ssm = (k.heads // mode.tp, k.head_dim, k.head_dim)
        layers = facts.count("kda")
    conv_numel, ssm_numel = conv[0] * conv[1], ssm[0] * ssm[1] * ssm[2]
    per_layer = conv_numel * conv_b + ssm_numel * ssm_b
    tensors = [StateTensor(tensor="conv", shape=list(conv), dtype_bytes=conv_b, bytes=conv_numel * conv_b),
               StateTensor(tensor="ssm", shape=list(ssm), dtype_bytes=ssm_b, bytes=ssm_numel * ssm_b)]
    return per_layer * layers, tensors


def mamba_strategy(facts: ModelFacts, mode: Mode) -> str | None:
    """The Mamba radix-cache strategy `auto` resolves to on CUDA (None: the radix cache is off)."""
    if not mode.radix_cache:
        return None
    wants = mode.overlap_schedule or mode.page_size > 1
    return "extra_buffer" if wants and set(facts.architectures[:1]) & extra_buffer_archs(mode.release) else "no_buffer"


def radix_state(facts: ModelFacts) -> bool:
    """The radix cache keeps this model's state layers, so SGLang validates its Mamba strategy: hybrids of GDN, KDA
    or Mamba layers (arg_groups/model_hook.py:224 and :1059 at 0.5.23); pure SSMs and LFM2's short convolutions
    are not validated (the 0.5.23 goldens size them at pages of 16 and 64)."""
    return facts.state_kind in ("gdn", "kda", "mamba") and not set(facts.architectures[:1]) & PURE_SSM_ARCHS


def overlap_schedule(facts: ModelFacts, mode: Mode) -> bool:
    """`no_buffer` turns the overlap scheduler off for hybrid state models."""
    return mode.overlap_schedule and not (facts.state_kind and mamba_strategy(facts, mode) == "no_buffer")


def slots_per_request(facts: ModelFacts, mode: Mode) -> int:
    """State slots one running request holds (`_calculate_mamba_ratio`, kv_cache_configurator.py:3062)."""
    strategy = mamba_strategy(facts, mode)
    if strategy is None:
        return 1
    extra = EXTRA_BUFFER_SLOTS[overlap_schedule(facts, mode)] if strategy == "extra_buffer" else 0
    return MAMBA_SLOTS_PER_REQUEST + extra


def mamba_slots(rest_gib: float, per_req: int, mode: Mode) -> tuple[int, float]:
    """(K state slots, GB left for the token pool), in the engine's float arithmetic; the pool's padding slot is
    charged from 0.5.17 (releases.MAMBA_PADDING_SLOT)."""
    padding = int(at(MAMBA_PADDING_SLOT, mode.release))
    if mode.max_mamba_cache_size is not None:
        slots = mode.max_mamba_cache_size
    elif not mode.radix_cache and mode.max_running_requests is not None:
        slots = max(1, mode.max_running_requests)
    else:
        share = rest_gib * mode.mamba_full_memory_ratio / (1 + mode.mamba_full_memory_ratio)
        slots = int((share * (1 << 30) - padding * per_req) // per_req)
    if slots <= 0:
        raise EngineRefusal(
            "RuntimeError",
            f"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
            f"max_mamba_cache_size={slots} (total_rest_memory={rest_gib:.2f} GB, "
            f"mamba_cache_per_req={per_req / MiB:.2f} MB). Try: (1) reduce --max-running-requests, "
            f"(2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or "
            f"(4) use GPUs with more memory.")
    return slots, rest_gib - (slots + padding) * per_req / (1 << 30)


def attention_cell(facts: ModelFacts, mode: Mode, layer: Layer | None = None) -> int:
    """Bytes one token costs in one attention layer of one rank (the model-wide geometry, or `layer`'s own:
    each layer's buffers are sized with its own heads and key / value widths)."""
    size = kv_bytes(facts, mode)
    if facts.mla_latent and facts.dsa_index_head_dim:
        return dsa_cell(facts, size, indexed=layer is None or layer.index not in facts.dsa_index_skips,
                        scaled=at(DSA_FP8_SCALED_CELL, mode.release))
    if facts.mla_latent:
        return sum(facts.mla_latent) * size
    heads = (layer.kv_heads if layer else None) or facts.kv_heads
    key = (layer.head_dim if layer else None) or facts.head_dim
    value = (layer.v_head_dim if layer else None) or key
    return max(1, heads // mode.tp) * (key + value) * size


DSA_QUANT_BLOCK = 128  # DSATokenToKVPool.quant_block_size: one float32 scale per 128 fp8 values


def dsa_cell(facts: ModelFacts, size: int, indexed: bool = True, scaled: bool = True) -> int:
    """A DSA layer's bytes per token: its MLA row and, unless it reuses another layer's top-k, its indexer key
    (fp8 with block scales). In fp8 the row is priced scaled with a bf16 rope part (kv_cache_configurator.py:3412
    calculate_mla_kv_cache_dim, the CUDA default DSA backends; `scaled`, from 0.5.17: releases.DSA_FP8_SCALED_CELL);
    the indexer row is pool_configurator.py:567."""
    rank, rope = facts.mla_latent or (0, 0)
    row = rank + rank // DSA_QUANT_BLOCK * 4 + rope * 2 if size == 1 and scaled else (rank + rope) * size
    index = facts.dsa_index_head_dim or 0
    return row + (index + index // DSA_QUANT_BLOCK * 4 if indexed else 0)


def dsa_index_skips(spec: ModelSpec) -> tuple[int, ...]:
    """The sparse-MLA layers of `spec` that keep no indexer key in SGLang's DSA pool."""
    return tuple(l.index for l in spec.layers if l.kind == SPARSE_MLA and dsa_skips_topk(spec.config, l.index))


def dsa_skips_topk(config: dict, layer: int) -> bool:
    """SGLang's `dsa_layer_skips_topk` (configs/model_config.py:488): a layer that reuses the previous top-k gets
    no indexer key (pool_configurator.py:629 counts only the others): `indexer_types` "shared", else every
    cli_factor-th layer indexes, else `index_topk_pattern` "S", else `index_topk_freq` from
    `index_skip_topk_offset` (GLM-5.2: 21 of 78 layers index)."""
    types = config.get("indexer_types")
    if types is not None:
        return 0 <= layer < len(types) and types[layer] == "shared"
    cli = config.get("cli_factor") or 1
    if cli > 1:
        return layer % cli != 0
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return layer < len(pattern) and pattern[layer] == "S"
    freq = config.get("index_topk_freq") or 1
    offset = config.get("index_skip_topk_offset")
    if offset is not None:
        return max(layer - offset + 1, 0) % freq != 0
    return max(layer - 1, 0) % freq != 0


def pool_bytes(facts: ModelFacts, mode: Mode, kinds: tuple[str, ...]) -> int:
    """Bytes one token costs over every layer of the given kinds on one rank (a pool's per-token size)."""
    return sum(attention_cell(facts, mode, layer) for layer in facts.layers if layer.kind in kinds)


def minimax_index_bytes(facts: ModelFacts, mode: Mode) -> int:
    """MiniMax-M3's index pool per token (pool_configurator.py:410, the `is_minimax_sparse` cell): one-head rows,
    not split by TP, in the model dtype, or in fp8 for fp8_e4m3 KV on Hopper from 0.5.23
    (releases.MINIMAX_INDEX_FP8_ON_HOPPER)."""
    if facts.minimax_index is None:
        return 0
    rows, width = facts.minimax_index
    fp8 = mode.kv_cache_dtype == "fp8_e4m3" and at(MINIMAX_INDEX_FP8_ON_HOPPER, mode.release)
    return rows * width * (1 if fp8 else dtype_bytes(facts.serving_dtype))


def sglang_window(facts: ModelFacts) -> int | None:
    """The sliding window SGLang's runner works with (some model classes report window - 1)."""
    if not facts.windows:
        return None
    window = min(facts.windows)
    return window - 1 if set(facts.architectures) & WINDOW_MINUS_ONE else window


def swa_floor(swa_tokens: int, window: int | None, page: int) -> None:
    """SGLang's `validate_swa_pool_size` (pool_configurator.py:198-216 at 0.5.23; from 0.5.16 only,
    releases.SWA_ADMISSION_FLOOR): no floor without a window."""
    if window is None:
        return
    if window + page >= swa_tokens:
        raise EngineRefusal(
            "ValueError",
            f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill admission floor is "
            f"sliding_window_size ({window}) + page_size ({page}). Increase --swa-full-tokens-ratio or the "
            f"total KV budget.")


def not_enough_memory() -> EngineRefusal:
    return EngineRefusal("RuntimeError", "Not enough memory. Please try to increase --mem-fraction-static.")


def swa_request_cap(facts: ModelFacts, window: int, mode: Mode) -> int:
    """SWA slots the scheduler can hold live at max_running_requests (no spec decoding)."""
    per_request = window + SWA_EVICTION_INTERVAL + mode.page_size + mode.page_size
    chunks = 2 if overlap_schedule(facts, mode) else 1
    return per_request * max(1, mode.max_running_requests) + chunks * mode.chunked_prefill_size + mode.page_size


def pools(facts: ModelFacts, mode: Mode, available: int) -> tuple[str, int, int | None]:
    """(configurator, full-pool tokens (max_total_num_tokens), SWA-pool tokens or None)."""
    page = mode.page_size
    window = sglang_window(facts)
    if hybrid_swa(facts, mode):
        full_b, swa_b = pool_bytes(facts, mode, ("full", "mla", "dsa")), pool_bytes(facts, mode, ("sliding",))
        if not swa_b:
            raise EngineRefusal("AssertionError", "Hybrid SWA model must have at least one SWA layer")
        # the request-cap configurator does not apply without a window (pool_configurator.py:1001)
        if mode.max_running_requests is not None and not mode.radix_cache and full_b and window is not None:
            swa = -(-swa_request_cap(facts, window, mode) // page) * page
            full = int((available - swa * swa_b) // full_b) // page * page
            if full <= 0:
                raise EngineRefusal(
                    "RuntimeError",
                    f"SWA pool cap ({swa} tokens, {swa * swa_b / GiB:.2f} GiB) leaves no room for "
                    f"the full KV pool within the available {available / GiB:.2f} GiB. Reduce "
                    f"--max-running-requests, lower SGLANG_SWA_EVICTION_INTERVAL, or increase "
                    f"--mem-fraction-static.")
            full, swa = _cap_total(full, swa, mode, capped_swa=True)
            return "SWARequestCapPoolConfigurator", full, swa
        if not full_b:
            tokens = int(available // swa_b) // page * page
            tokens = _cap_total(tokens, None, mode)[0]
            if tokens <= 0:
                raise not_enough_memory()
            return "HybridSWAPoolConfigurator", 0, tokens
        ratio = mode.swa_full_tokens_ratio
        cell_size = full_b + ratio * swa_b
        full = int(available // cell_size) // page * page
        if mode.max_total_tokens is not None and mode.max_total_tokens < full:
            full = mode.max_total_tokens // page * page
        swa = int(full * ratio) // page * page
        if at(SWA_ADMISSION_FLOOR, mode.release):
            swa_floor(swa, window, page)
        if full <= 0:
            raise not_enough_memory()
        return "HybridSWAPoolConfigurator", full, swa
    per_token = pool_bytes(facts, mode, ("full", "sliding", "mla", "dsa")) + minimax_index_bytes(facts, mode)
    if not per_token:  # no attention layer: the pool holds the context length (pool_configurator.py:246)
        return "DefaultPoolConfigurator", (mode.max_total_tokens or mode.context_length) // page * page, None
    tokens = available // per_token // page * page
    tokens = _cap_total(tokens, None, mode)[0]
    if tokens <= 0:
        raise not_enough_memory()
    return "DefaultPoolConfigurator", tokens, None


def _cap_total(full: int, swa: int | None, mode: Mode, capped_swa: bool = False) -> tuple[int, int | None]:
    """--max-total-tokens caps the pool the profile gave (page-aligned again)."""
    cap = mode.max_total_tokens
    if cap is None or cap >= full:
        return full, swa
    full = cap // mode.page_size * mode.page_size
    return full, (min(swa, cap) if capped_swa and swa is not None else swa)


def max_running(facts: ModelFacts, tokens: int, mode: Mode, slots: int | None, notes: list[str]) -> int:
    estimate = max(min(int(tokens / mode.context_length * 512), 4096), 2048)
    if mode.max_running_requests is not None:
        value = min(max(1, mode.max_running_requests), tokens // 2)
    else:
        value = min(estimate, tokens // 2)
    if slots is not None:
        ratio = slots_per_request(facts, mode)
        cap = slots // ratio
        if cap < value:
            notes.append(f"max_running_requests is capped to {cap} by the mamba state cache "
                         f"(max_mamba_cache_size={slots}, {ratio} state slots per request). To raise it: increase "
                         "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
                         "--mamba-ssm-dtype bfloat16.")
        value = min(value, cap)
        if value <= 0:
            raise EngineRefusal(
                "RuntimeError",
                f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                f"max_mamba_cache_size={slots}, mamba_ratio={ratio}, resulting max_num_reqs={value}. Try: (1) "
                f"reduce --max-running-requests, (2) increase --mem-fraction-static, or (3) use GPUs with more "
                f"memory.")
    return value


def describe_mode(facts: ModelFacts, mode: Mode) -> ModeRecord:
    out = ModeRecord(context_length=mode.context_length, page_size=mode.page_size, kv_cache_dtype=mode.kv_cache_dtype,
                     tp=mode.tp, hybrid_swa=hybrid_swa(facts, mode) and bool(facts.count("sliding")),
                     radix_cache=mode.radix_cache, max_running_requests=mode.max_running_requests,
                     max_total_tokens=mode.max_total_tokens)
    if facts.count("sliding"):
        out.swa_full_tokens_ratio = mode.swa_full_tokens_ratio
        out.disable_hybrid_swa_memory = mode.disable_hybrid_swa_memory
    if facts.state_kind:
        out.mamba_ssm_dtype = ssm_dtype(facts, mode)
        out.mamba_full_memory_ratio = mode.mamba_full_memory_ratio
        out.max_mamba_cache_size = mode.max_mamba_cache_size
    return out


def plan(facts: ModelFacts, mode: Mode) -> SglangBudget:
    if facts.dsv4 is not None and key(mode.release) < key(DSV4_SIZED_SINCE):
        raise InputError(f"DeepSeek-V4's SGLang pool sizing is modelled from {DSV4_SIZED_SINCE} on, not at "
                         f"{mode.release}")
    if facts.minimax_index is not None and key(mode.release) < key(MINIMAX_SPARSE_SIZED_SINCE):
        raise InputError(f"MiniMax-M3's SGLang sparse pool sizing is modelled from {MINIMAX_SPARSE_SIZED_SINCE} on, "
                         f"not at {mode.release}")
    budget = SglangBudget(engine="sglang", version=mode.release, mode=describe_mode(facts, mode),
                          capacity=CapacityRecord(context_length=mode.context_length,
                                                  kv_budget_bytes=mode.kv_budget_bytes),
                          provenance={"formula": "kvdoctor.engines.sglang.budget",
                                      "checked_against": "goldens/sglang.json",
                                      "refs": [f"sglang/{r}" for r in REFS.values()]})
    kinds = facts.kinds()
    swa_pool = hybrid_swa(facts, mode) and kinds["sliding"]
    for kind in ("full", "sliding", "mla", "dsa"):
        if kinds[kind]:
            cells = {attention_cell(facts, mode, l) for l in facts.layers if l.kind == kind}
            budget.layer_kinds.append(LayerKindRecord(
                kind=kind, layers=kinds[kind], bytes_per_token_per_layer=cells.pop() if len(cells) == 1 else sorted(cells),
                pool="swa" if kind == "sliding" and swa_pool else "full"))
    if kinds["sliding"] and not swa_pool:
        budget.notes.append(f"hybrid SWA memory is off for {', '.join(facts.architectures) or facts.model_type}: "
                            "sliding layers get full-length slots in the one token pool")
    try:
        rest = mode.kv_budget_bytes / (1 << 30)
        slots = None
        if facts.state_kind:
            per_req, tensors = state_per_request(facts, mode)
            budget.state = StateRecord(kind=facts.state_kind, slots=None, bytes_per_slot=per_req,
                                       slots_per_request=slots_per_request(facts, mode), bytes=None,
                                       mamba_radix_cache_strategy=mamba_strategy(facts, mode),
                                       ssm_dtype=ssm_dtype(facts, mode), tensors=tensors)
            budget.layer_kinds.append(LayerKindRecord(
                kind=facts.state_kind, layers=kinds[facts.state_kind], bytes_per_token_per_layer=0, pool="state",
                bytes_per_request_per_layer=per_req // kinds[facts.state_kind]))
            if budget.state.mamba_radix_cache_strategy == "no_buffer" and mode.page_size > 1 and radix_state(facts):
                # server_args.py:4252 at 0.5.15, arg_groups/mamba_hook.py:157 at 0.5.23
                raise EngineRefusal("AssertionError", "no_buffer only supports page_size=1.")
            slots, rest = mamba_slots(rest, per_req, mode)
            budget.state.slots, budget.state.bytes = slots, (slots + 1) * per_req
        available = int(rest * (1 << 30))
        if facts.dsv4 is not None:
            mode = replace(mode, max_running_requests=mode.max_running_requests or dsv4.DEFAULT_MAX_RUNNING)
            budget.pools = dsv4_pools(facts, mode, available)
            budget.mode.configurator = "DSV4PoolConfigurator" if hybrid_swa(facts, mode) else "DefaultPoolConfigurator"
            budget.mode.swa_full_tokens_ratio = dsv4_swa_ratio(mode)
            full, swa = budget.pools[0].tokens, None
        else:
            configurator, full, swa = pools(facts, mode, available)
            budget.mode.configurator = configurator
            index = 0 if hybrid_swa(facts, mode) else minimax_index_bytes(facts, mode)
            budget.pools = [PoolRecord(pool="full", tokens=full,
                                       bytes_per_token=pool_bytes(facts, mode, _full_pool(facts, mode)) + index)]
        if swa is not None:
            budget.pools.append(PoolRecord(pool="swa", tokens=swa, bytes_per_token=pool_bytes(facts, mode, ("sliding",))))
        tokens = full if full else swa
        running = max_running(facts, tokens, mode, slots, budget.notes)
    except EngineRefusal as refusal:
        budget.error = refusal
        return budget
    budget.capacity.max_running_requests = running
    budget.capacity.max_total_num_tokens = tokens
    budget.capacity.concurrency_at_L = tokens / mode.context_length
    return budget


def dsv4_swa_ratio(mode: Mode) -> float:
    return mode.swa_full_tokens_ratio if mode.swa_ratio_set else dsv4.DEFAULT_SWA_RATIO


def dsv4_pools(facts: ModelFacts, mode: Mode, available: int) -> list[PoolRecord]:
    """DeepSeek-V4's pools (kvdoctor.engines.sglang.dsv4): DSV4PoolConfigurator's with hybrid-SWA memory on, the
    default configurator's one-head MHA cell with it off; the page is the dsv4 backend's whatever --page-size says,
    and `auto` KV is fp8 (arg_groups/model_overrides/deepseek_v4.py)."""
    cfg = facts.dsv4 or {}
    if hybrid_swa(facts, mode):
        sized = dsv4.pools(cfg, available, dsv4_swa_ratio(mode), mode.max_running_requests or dsv4.DEFAULT_MAX_RUNNING)
        if sized.full <= 0:
            raise not_enough_memory()
        return [PoolRecord(pool="full", tokens=sized.full, bytes_per_token=round(sized.bytes_per_full_token)),
                PoolRecord(pool="swa", tokens=sized.swa, bytes_per_token=round(dsv4.swa_token_bytes(dsv4.dims(cfg))))]
    cell = dsv4.default_cell(cfg, 1 if mode.kv_cache_dtype == "auto" else kv_bytes(facts, mode))
    tokens = available // cell // dsv4.PAGE * dsv4.PAGE
    if tokens <= 0:
        raise not_enough_memory()
    return [PoolRecord(pool="full", tokens=tokens, bytes_per_token=cell)]


def _full_pool(facts: ModelFacts, mode: Mode) -> tuple[str, ...]:
    """The layer kinds whose tokens the full pool holds."""
    if hybrid_swa(facts, mode) and facts.count("sliding"):
        return ("full", "mla", "dsa")
    return ("full", "sliding", "mla", "dsa")


# --- the budget half of the SGLang profile: the `sglang:` section's modes, the memory, one Budget per mode

def usable_memory(gpu: int, weights: int, s: SglangSettings, mla: bool = False,
                  config: dict[str, Any] | None = None) -> tuple[int, str]:
    """What SGLang leaves for KV caches and state on one rank of a GPU of `gpu` bytes: the formula `kvdoctor
    fit` prices (`sglang.reserve.pool`), with the deployer's settings and the release's own defaults (`config`:
    config.json as written, which the defaults read)."""
    from kvdoctor.engines.sglang import reserve

    p = reserve.pool(gpu, weights, s.tp_size or 1, s.pp_size, s.dp_size, s.enable_dp_attention, mla,
                     release=s.release or VERSION, max_running=s.max_running_requests,
                     chunked=s.chunked_prefill_size if "chunked_prefill_size" in s.model_fields_set else None,
                     mem_fraction_static=s.mem_fraction_static, config=config)
    return p.kv, (f"GPU {gpu} B - in use before loading {p.preload} B - reserved {p.reserved} B "
                  f"(mem_fraction_static {p.mem_fraction_static}) - weights {weights} B per rank; {p.how}")


def modes(facts: ModelFacts, s: SglangSettings, context: int, memory: int, all_modes: bool) -> list[Mode]:
    base = Mode(context_length=context, kv_budget_bytes=memory, page_size=s.page_size,
                swa_full_tokens_ratio=s.swa_full_tokens_ratio,
                swa_ratio_set="swa_full_tokens_ratio" in s.model_fields_set,
                disable_hybrid_swa_memory=s.disable_hybrid_swa_memory,
                kv_cache_dtype=s.kv_cache_dtype, tp=s.tp_size or 1, max_mamba_cache_size=s.max_mamba_cache_size,
                mamba_full_memory_ratio=s.mamba_full_memory_ratio, mamba_ssm_dtype=s.mamba_ssm_dtype,
                radix_cache=s.radix_cache, max_running_requests=s.max_running_requests,
                max_total_tokens=s.max_total_tokens, chunked_prefill_size=s.chunked_prefill_size,
                release=s.release or VERSION)
    if not all_modes:
        return [base]
    out = [base]
    if hybrid_swa(facts, base) and facts.windows:
        out += [replace(base, swa_full_tokens_ratio=r, swa_ratio_set=True) for r in (0.5, 0.2)
                if r != base.swa_full_tokens_ratio]
        out.append(replace(base, disable_hybrid_swa_memory=True))
    if facts.state_kind:
        other = "bfloat16" if ssm_dtype(facts, base) == "float32" else "float32"
        out += [replace(base, mamba_ssm_dtype=other), replace(base, radix_cache=not base.radix_cache)]
    if base.kv_cache_dtype == "auto":
        out.append(replace(base, kv_cache_dtype="fp8_e4m3"))
    return out


def budgets(facts: ModelFacts, s: SglangSettings, inputs: BudgetSettings,
            all_modes: bool) -> tuple[list[SglangBudget], dict[str, Any]]:
    usable = partial(usable_memory, s=s, mla=bool(facts.mla_latent), config=facts.raw_config)
    memory, how = kv_memory("sglang", facts, inputs, usable, tp=s.tp_size or 1)
    context = default_context(facts, inputs)
    out = [plan(facts, m) for m in modes(facts, s, context, memory, all_modes)]
    for b in out:
        if b.error is None:
            b.capacity.max_context_fit = b.capacity.max_total_num_tokens
    return out, how


def view(row: dict[str, Any]) -> BudgetView:
    """A budget row as the reports show it: SGLang's knobs, its pools, and the pool's tokens as the
    tokens that fit."""
    m, c, s = row["mode"], row["capacity"], row.get("state")
    knobs = [f"page {m['page_size']}", f"kv {m['kv_cache_dtype']}", f"tp {m['tp']}"]
    mode, label = list(knobs), list(knobs)
    if "swa_full_tokens_ratio" in m:
        mode.append(f"swa ratio {m['swa_full_tokens_ratio']}" if m["hybrid_swa"] else "no SWA pool")
        if m["hybrid_swa"]:
            label.append(f"swa ratio {m['swa_full_tokens_ratio']}")
    if "mamba_ssm_dtype" in m:
        mode.append(f"ssm {m['mamba_ssm_dtype']}")
        label.append(f"ssm {m['mamba_ssm_dtype']}")
    mode.append(f"radix {'on' if m['radix_cache'] else 'off'}")
    layout = "\n".join(f"{p['pool']}: {n(p['tokens'])} tok ({n(p['bytes_per_token'])} B/tok)"
                       for p in row["pools"]) if row.get("pools") else "-"
    state = "-"
    if s:
        slots = "?" if s["slots"] is None else n(s["slots"])
        state = f"{slots} slots x {size(s['bytes_per_slot'])}\n{s['slots_per_request']}/request, ssm {s['ssm_dtype']}"
    refused = bool(row.get("error"))
    capacity = "" if refused else (f"max running {n(c['max_running_requests'])}\npool {n(c['max_total_num_tokens'])} "
                                   f"tokens\n{c['concurrency_at_L']:.2f} contexts of {n(c['context_length'])}")
    return BudgetView(mode=tuple(mode), label=tuple(label), layout=layout, state=state, capacity=capacity,
                      tokens=None if refused else c["max_total_num_tokens"], colour="dark_orange")
