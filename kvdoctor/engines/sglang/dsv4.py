"""DeepSeek-V4's pools as SGLang 0.5.23 sizes them on CUDA: `DSV4PoolConfigurator`
(model_executor/pool_configurator.py:1067-1655), with the defaults its start-up hook sets; and as 0.5.15-0.5.20
priced them (`paged=False`, releases.DSV4_PAGED_ROWS): every row at its raw 584 bytes, the ratio-4 compressor
state ring spread over the model's window (`window_size`, 128) of SWA slots rather than a 256-token page, and only
ratios 4 and 128 owning compressed storage.

Every layer keeps its window's keys in an SWA pool; a layer of compress ratio 4 or 128 also keeps compressed keys,
one entry per `ratio` tokens (ratio 4 with an fp8 indexer key), and ratios 1 / 2 do so on the layers
`kv_source_layer_ids` names (mem_cache/deepseek_v4_memory_pool.py:94 collect_sources_by_ratio). Rows are FlashMLA's
V4 layout (fp8 NoPE, bf16 RoPE, 8 scale bytes) in pages padded to 576 bytes (kernels/ops/attention/dsv4/
kv_layout.py:103). The configurator prices one full-pool token as its compressed bytes plus `ratio` SWA tokens
(each SWA token carrying its share of the ratio-4 compressor state ring), and holds back fixed bytes for the
request-scoped ratio-128 (and ratio-2) compressor state of `max_running_requests + 1` request slots.

Out of scope (not the CUDA defaults): the unified-KV ring (HIP only), the trtllm backend, the V4.1 layouts
(SM100), HiSparse, online c128 compression, speculative decoding and encoder replay. Hybrid-SWA memory off
sizes with the default configurator instead (`default_cell`).
"""
from __future__ import annotations

from typing import Any, Mapping

import msgspec

PAGE = 256  # arg_groups/model_overrides/deepseek_v4.py:51-61: the dsv4 backend's page, whatever --page-size says
PAGE_ALIGN = 576  # KVLayout.V4.page_align
SCALE_BYTES = 8  # KVLayout.V4.scale_bytes
DEFAULT_SWA_RATIO = 0.1  # deepseek_v4.py:44-49 sets --swa-full-tokens-ratio when the deployer leaves it unset
DEFAULT_MAX_RUNNING = 256  # arg_groups/deepseek_v4_hook.py:138-143 sets --max-running-requests when unset
STATE_BYTES = 4  # SGLANG_DSV4_COMPRESS_STATE_DTYPE defaults to float32 (environ.py:1832)
RING = {2: 2, 4: 8, 128: 128}  # get_compress_state_ring_size without speculative decoding
INDEX_SCALE_GROUP = 128  # an fp8 indexer key carries one float32 scale per 128 values


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Dims(msgspec.Struct, frozen=True):
    layers: int
    nope: int
    rope: int
    index_head: int
    owners: dict[int, int]  # compress ratio -> layers owning compressed storage of it
    paged: bool = True  # rows priced as padded FlashMLA pages (from 0.5.21), else raw
    window: int = 128  # the SWA slots one ratio-4 state ring is spread over before 0.5.21

    @property
    def head(self) -> int:
        return self.nope + self.rope


def dims(cfg: Mapping[str, Any], paged: bool = True) -> Dims:
    """The sizes the configurator reads (DeepseekV4Config's, configs/deepseek_v4.py; ratios past the layer count
    belong to the MTP layer and are not this model's pool). Before 0.5.21 (`paged` False) the configurator counts
    the layers of ratio 4 and 128 only (pool_configurator.py:985-987 @ v0.5.20, `num_layers_ca4` / `_ca128`)."""
    n = cfg.get("num_hidden_layers") or 0
    ratios = list(cfg.get("compress_ratios") or [])[:n]
    rope = cfg.get("qk_rope_head_dim") or 64
    owners = {r: ratios.count(r) for r in (4, 128) if r in ratios}
    for r in (1, 2) if paged else ():
        sources = [i for i in cfg.get("kv_source_layer_ids") or [] if 0 <= i < len(ratios) and ratios[i] == r]
        if sources:
            owners[r] = len(sources)
    return Dims(n, (cfg.get("head_dim") or 512) - rope, rope, cfg.get("index_head_dim") or 128, owners, paged,
                cfg.get("window_size") or 128)


def page_bytes_per_token(d: Dims, ratio: int = 1) -> float:
    """A V4-layout page of `PAGE // ratio` entries, padded, per entry (before 0.5.21 the raw row,
    pool_configurator.py:1113 @ v0.5.20)."""
    row = d.nope + 2 * d.rope + SCALE_BYTES
    if not d.paged:
        return row
    entries = PAGE // ratio
    return cdiv(entries * row, PAGE_ALIGN) * PAGE_ALIGN / entries


def index_bytes(head: int, fp4: bool = False) -> int:
    """get_dsv4_indexer_bytes_per_token (deepseek_v4_memory_pool.py:53)."""
    return head // 2 + head // 32 if fp4 else head + head // INDEX_SCALE_GROUP * 4


def swa_token_bytes(d: Dims) -> float:
    """One SWA slot over all layers, with the ratio-4 compressor state (kv and score, overlapped: 4 x head) a
    slot carries (`_get_bytes_per_swa_token`; before 0.5.21 the ring over `window` slots, `c4_ring_size /
    swa_page_size`, pool_configurator.py:1129 @ v0.5.20, :1253 @ v0.5.21)."""
    state = 2 * 2 * (d.head + d.index_head) * STATE_BYTES
    return page_bytes_per_token(d) * d.layers + RING[4] / (PAGE if d.paged else d.window) * state * d.owners.get(4, 0)


def full_token_bytes(d: Dims, swa_ratio: float) -> float:
    """`_get_bytes_per_full_token`: `swa_ratio` SWA slots plus each owner's compressed entry share."""
    per_ratio = {4: (page_bytes_per_token(d, 4) + index_bytes(d.index_head)) / 4,
                 128: page_bytes_per_token(d, 128) / 128}
    for r in (1, 2):  # their indexer pools are built fp4 (force_fp4) whatever the cache's dtype
        per_ratio[r] = (page_bytes_per_token(d, r) + index_bytes(d.index_head, fp4=True)) / r
    return swa_ratio * swa_token_bytes(d) + sum(per_ratio[r] * count for r, count in d.owners.items())


def fixed_bytes(d: Dims, max_running: int) -> int:
    """The request-scoped compressor state of ratios 128 and 2: `slots x ring + ring + 1` rows (padded to 128 and 2)
    of kv and score per head value (`_get_c128_state_fixed_bytes`, `_get_c2_state_fixed_bytes`)."""
    slots, out = max_running + 1, 0
    for r, pad in ((128, 128), (2, 2)):
        if d.owners.get(r):
            rows = cdiv(slots * RING[r] + RING[r] + 1, pad) * pad
            out += rows * 2 * d.head * STATE_BYTES * d.owners[r]
    return out


def low_ratio_padding(d: Dims, full: int) -> float:
    """Ratios 1 / 2 reserve one page of entries and round their indexer to whole index pages
    (`_get_low_ratio_kv_padding_bytes`; DSV41_INDEX_PAGE_SIZE 64)."""
    out = 0.0
    for r in (1, 2):
        if d.owners.get(r):
            index_slots = cdiv((full + PAGE) // r + 64, 64) * 64
            out += (PAGE * page_bytes_per_token(d, r)
                    + (index_slots - full // r) * index_bytes(d.index_head, fp4=True)) * d.owners[r]
    return out


class Pools(msgspec.Struct, frozen=True):
    full: int
    swa: int
    bytes_per_full_token: float
    fixed_bytes: int


def pools(cfg: Mapping[str, Any], available: int, swa_ratio: float, max_running: int, paged: bool = True) -> Pools:
    """`calculate_pool_sizes` with the SWA pool sized by ratio (the hook always sets one, so the request-cap mode
    of an unset ratio is not reached): full tokens from what the fixed state leaves, whole pages."""
    d = dims(cfg, paged)
    per_full = full_token_bytes(d, swa_ratio)
    fixed = fixed_bytes(d, max_running)
    left = max(available - fixed, 0)
    full = int(left / per_full) // PAGE * PAGE
    while full > 0 and full * per_full + low_ratio_padding(d, full) > left:
        full -= PAGE
    return Pools(full, int(full * swa_ratio) // PAGE * PAGE, per_full, fixed)


def default_cell(cfg: Mapping[str, Any], kv_bytes: int) -> int:
    """Hybrid-SWA memory off: the default configurator's MHA cell, one KV head of `head_dim` keys and values per
    layer (ModelConfig reads DeepSeek-V4 as MHA with one KV head)."""
    return (cfg.get("num_hidden_layers") or 0) * 2 * (cfg.get("head_dim") or 512) * kv_bytes
