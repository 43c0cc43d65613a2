"""DeepSeek-V4's KV caches as vLLM 0.34.0 builds, groups and sizes them (CUDA: the fp8_ds_mla layout).

Each decoder layer has several caches, each its own spec (models/deepseek_v4/attention.py, compressor.py,
v1/attention/backends/mla/sparse_swa.py):
- every layer: the sliding-window cache, a `SlidingWindowMLASpec` of block 64 over `sliding_window` tokens;
- a layer whose type compresses (ratio `compress_rates[layer_type]`, 4 or 128): the compressed keys, an
  `MLAAttentionSpec` of block 256 holding one entry per `ratio` tokens, and the compressor's float32 state, a
  `SlidingWindowMLASpec` of block 4 (ratio 4) or 8 (ratio 128) over `coff x ratio` tokens, coff being 2 where
  ratio-4 windows overlap;
- a ratio-4 layer also has the sparse indexer: its key cache (`index_head_dim` fp8 bytes plus a 4-byte scale per
  128, one entry per 4 tokens, block 256) and its own compressor state (coff 2 over `index_head_dim`).
A page is the block's entries times their bytes, rounded up to 576 (FlashMLA's packing). vLLM groups these
unequal pages block-outermost (v1/core/kv_cache_planning.py `_get_packed_kv_cache_groups`); with the hybrid
manager off it promotes every sliding spec to an `MLAAttentionSpec` of block 256, one group.
"""
from __future__ import annotations

from typing import Any, Mapping

import msgspec

from kvdoctor.engines.budget.common import longest_fitting
from kvdoctor.engines.releases import at
from kvdoctor.engines.vllm import releases
from kvdoctor.errors import InputError

SLIDING_MLA = "SlidingWindowMLASpec"
MLA = "MLAAttentionSpec"
SWA_BLOCK = 64  # sparse_swa.py: the sliding-window cache's own block
COMPRESSED_BLOCK = 256  # the block vLLM runs DeepSeek-V4's compressed caches at, whatever --block-size says
STATE_BLOCK = {4: 4, 128: 8}  # compressor.py: the state cache's block per ratio
FP8_DS_MLA_ENTRY = 584  # 448 fp8 NoPE bytes + 64 bf16 RoPE values + 8 scale bytes
PAGE_ALIGNMENT = 576
INDEX_SCALE_GROUP = 128  # the indexer keys carry one float32 scale per 128 fp8 values
DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
COMPRESSOR_HEADS = (512, 128)
RATIO_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Cache(msgspec.Struct, frozen=True):
    """One cache spec vLLM builds: `entry_bytes` per stored entry, one entry per `tokens_per_entry` tokens."""

    name: str  # the layer-relative module name vLLM registers it under (attn.swa_cache, ...)
    index: int
    spec: str
    block_size: int
    entry_bytes: int
    head_size: int
    dtype: str
    window: int | None = None
    tokens_per_entry: int = 1

    @property
    def page(self) -> int:
        return cdiv(self.block_size // self.tokens_per_entry * self.entry_bytes, PAGE_ALIGNMENT) * PAGE_ALIGNMENT

    def promoted(self, block: int) -> Cache:
        """HMA off: a sliding spec becomes an MLAAttentionSpec at the compressed block, its page re-aligned."""
        if self.spec == MLA:
            return self
        return msgspec.structs.replace(self, spec=MLA, block_size=block, window=None)

    def blocks(self, length: int, in_flight: int) -> int:
        """The blocks one request of `length` holds (max_memory_usage_bytes / page)."""
        if self.spec == SLIDING_MLA and self.window is not None:
            return cdiv(min(self.window - 1 + in_flight, length), self.block_size) + 1
        return cdiv(length, self.block_size)


def _positive(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError(f"config.json: {key} must be a positive integer for DeepSeek-V4's KV caches")
    return value


def layer_ratios(cfg: Mapping[str, Any]) -> list[int]:
    """DeepseekV4Config (transformers 5.22): `layer_types` as given, else from the legacy `compress_ratios`, else
    two heavily compressed layers then compressed-sparse / heavily compressed in turn; each type's ratio from
    `compress_rates` (legacy `compress_rate_csa` / `_hca` override it); 1 (no compression) for the others."""
    n = _positive(cfg, "num_hidden_layers", 43)
    rates = dict(cfg.get("compress_rates") or DEFAULT_RATES)
    for key, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                      ("compress_rate_hca", "heavily_compressed_attention")):
        if cfg.get(key) is not None:
            rates[kind] = cfg[key]
    types = cfg.get("layer_types")
    if types is None and isinstance(cfg.get("compress_ratios"), list):
        unknown = [r for r in cfg["compress_ratios"] if r not in RATIO_TYPES]
        if unknown:  # the configuration class has no layer type for it
            raise InputError(f"config.json: compress_ratios holds {unknown[0]!r}, which names no DeepSeek-V4 layer type")
        types = [RATIO_TYPES[r] for r in cfg["compress_ratios"]]
    if types is None:
        types = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    ratios = [max(1, int(rates.get(str(t), 0) or 0)) for t in list(types)[:n]]
    odd = sorted({r for r in ratios if r not in (1, *STATE_BLOCK)})
    if odd:  # compressor.py asserts the ratio is 4 or 128
        raise InputError(f"config.json: DeepSeek-V4 compresses by 4 or 128, not {odd[0]}")
    return ratios


def as_release_reads(cfg: Mapping[str, Any], release: str) -> Mapping[str, Any]:
    """The config as the release's attention reads its compression: up to 0.32.0 from the `compress_ratios` list
    alone, `layer_types` unread (releases.DSV4_READS_COMPRESS_RATIOS)."""
    if "layer_types" in cfg and isinstance(cfg.get("compress_ratios"), list) and at(
            releases.DSV4_READS_COMPRESS_RATIOS, release):
        return {key: value for key, value in cfg.items() if key != "layer_types"}
    return cfg


def unsupported_compressor_head(cfg: Mapping[str, Any]) -> tuple[str, int] | None:
    """(key, head size) of a compressor vLLM cannot build, if any: DeepseekCompressor packs its fused quant+cache
    for a head of 512 (the attention's) or 128 (the indexer's) only (compressor.py:310-329 @ 0.34.0)."""
    ratios = layer_ratios(cfg)
    heads = ([("head_dim", cfg.get("head_dim", 512))] if any(r > 1 for r in ratios) else []) + (
        [("index_head_dim", cfg.get("index_head_dim", 128))] if 4 in ratios else [])
    return next(((k, h) for k, h in heads if isinstance(h, int) and h not in COMPRESSOR_HEADS), None)


def caches(cfg: Mapping[str, Any]) -> list[Cache]:
    """The specs vLLM's worker collects, in its order (the indexer's before the attention's own)."""
    head = _positive(cfg, "head_dim", 512)  # DeepseekV4Config's defaults
    window = _positive(cfg, "sliding_window", 128)
    out: list[Cache] = []
    for i, ratio in enumerate(layer_ratios(cfg)):
        if ratio == 4:
            index_head = _positive(cfg, "index_head_dim", 128)
            key = index_head + index_head // INDEX_SCALE_GROUP * 4
            out += [Cache("attn.indexer.k_cache", i, MLA, COMPRESSED_BLOCK, key, key, "uint8", None, ratio),
                    _state("attn.indexer.compressor.state_cache", i, ratio, index_head)]
        out.append(Cache("attn.swa_cache", i, SLIDING_MLA, SWA_BLOCK, FP8_DS_MLA_ENTRY, head, "uint8", window))
        if ratio > 1:
            out += [Cache("attn", i, MLA, COMPRESSED_BLOCK, FP8_DS_MLA_ENTRY, head, "uint8", None, ratio),
                    _state("attn.compressor.state_cache", i, ratio, head)]
    return out


def _state(name: str, index: int, ratio: int, head: int) -> Cache:
    """A compressor's float32 state: key and score of `coff x head` values per token, over `coff x ratio` tokens."""
    coff = 2 if ratio == 4 else 1
    size = coff * head * 2
    return Cache(name, index, SLIDING_MLA, STATE_BLOCK[ratio], size * 4, size, "float32", coff * ratio)


def _uniform_key(c: Cache) -> tuple[Any, ...]:
    """UniformTypeKVCacheSpecs.is_uniform_type: one block size, and one window among sliding specs."""
    return (c.block_size, c.spec == SLIDING_MLA, c.window if c.spec == SLIDING_MLA else None)


def _approximate_gcd(values: list[int], lower: int) -> int:
    """The repeats per group with the least padding over `values` (ties: the larger), from `lower` up."""
    best, best_pad = max(1, lower), None
    for d in range(max(1, lower), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


def groups(specs: list[Cache]) -> list[list[Cache]]:
    """vLLM's packed grouping: buckets of one uniform type; a bucket holding as many layers of each of its page
    sizes repeats a pattern, and such buckets split into groups of the same number of repeats; sliding buckets
    (state, when no bucket repeats) split only as far as the widest group's block already holds them."""
    if len({c.page for c in specs}) <= 1 or len({_uniform_key(c) for c in specs}) == 1:
        return [specs]
    buckets: dict[tuple[Any, ...], list[Cache]] = {}
    for c in specs:
        buckets.setdefault(_uniform_key(c), []).append(c)
    shaped = []
    for bucket in buckets.values():
        by_page: dict[int, list[Cache]] = {}
        for c in bucket:
            by_page.setdefault(c.page, []).append(c)
        shaped.append((bucket, by_page, len({len(v) for v in by_page.values()}) == 1))

    def widest(by_page: dict[int, list[Cache]]) -> int:
        return max(len(v) for v in by_page.values())

    floor = max((widest(p) for _, p, balanced in shaped if balanced and len(p) > 1), default=0)
    repeats = _approximate_gcd([widest(p) for _, p, balanced in shaped if balanced], floor) if floor else None

    def count(by_page: dict[int, list[Cache]], balanced: bool) -> int:
        return cdiv(widest(by_page), repeats) if balanced and repeats is not None else 1

    def is_state(bucket: list[Cache]) -> bool:
        return repeats is None and bucket[0].spec == SLIDING_MLA

    def group_bytes(by_page: dict[int, list[Cache]], n: int) -> int:
        return sum(cdiv(len(v), n) * page for page, v in by_page.items())

    anchor = max(group_bytes(p, len(b) if is_state(b) else count(p, bal)) for b, p, bal in shaped)
    out: list[list[Cache]] = []
    for bucket, by_page, balanced in shaped:
        n = count(by_page, balanced)
        if anchor and is_state(bucket):
            n = max(n, cdiv(len(bucket), max(anchor // bucket[0].page, 1)))
        if n == 1:
            out.append(bucket)
            continue
        pattern = list(zip(*by_page.values()))
        out += [[c for repeat in pattern[i::n] for c in repeat] for i in range(n)]
    return out


class Sizing(msgspec.Struct, frozen=True):
    specs: list[Cache]  # as the worker built them
    groups: list[list[Cache]]  # as the manager groups them (promoted with HMA off)
    bytes_per_block: int  # the widest group's pages: one block id holds a page of every member of a group
    blocks_per_request: int  # at max_model_len
    promoted: bool  # HMA off turned the sliding specs into MLAAttentionSpecs

    @property
    def needed(self) -> int:
        return self.bytes_per_block * self.blocks_per_request


def size(cfg: Mapping[str, Any], hma: bool, length: int, in_flight: int) -> Sizing:
    specs = caches(cfg)
    # _promote_local_kv_cache_specs: only specs of more than one type, with an MLAAttentionSpec to promote to
    promoted = not hma and len({_uniform_key(c) for c in specs}) > 1 and any(c.spec == MLA for c in specs)
    grouped = groups([c.promoted(COMPRESSED_BLOCK) for c in specs] if promoted else specs)
    return Sizing(specs, grouped, max(sum(c.page for c in g) for g in grouped),
                  blocks_needed(grouped, length, in_flight), promoted)


def blocks_needed(grouped: list[list[Cache]], length: int, in_flight: int) -> int:
    """A group's blocks per request are its widest member's; the groups each take their own."""
    return sum(max(c.blocks(length, in_flight) for c in g) for g in grouped)


def largest_fitting_length(grouped: list[list[Cache]], stride: int, in_flight: int, memory: int, top: int) -> int:
    """vLLM's binary search (_estimate_max_model_len_from_groups) for the longest length that fits `memory`."""
    return longest_fitting(lambda length: stride * blocks_needed(grouped, length, in_flight) <= memory, top)
