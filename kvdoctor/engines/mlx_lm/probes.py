"""Build mlx-lm's own cache objects for the planned layers, with the model's true KV-head counts, head
sizes and dtype, and drive them through mlx-lm's own code (mlx on CPU):

  window    a prompt of max_size + 3 tokens, then two decode tokens: a RotatingKVCache must hold exactly
            its `keep` first positions and the latest ones (canary keys: each key's value is its position)
  quantize  mlx-lm's `maybe_quantize_kv_cache` with the deploy section's bits and group size, then one
            decode token into whatever it returned
  trim      `is_trimmable` before and after the window wrapped, and `trim(2)` while it may
  merge     `generate._merge_caches` of three requests of different lengths (empty, short, past the window),
            as the BatchGenerator merges them

One cache per distinct (class, size, keep, chunk, heads, head size, dtype) stands for its layers. A
recurrent-state cache (ArraysCache) holds no keys: it is driven through trim and merge with small arrays.
What broke is recorded as data (class and exact text); kvdoctor.checks.mlx_lm_probe judges it.
"""
from __future__ import annotations

from typing import Any, Callable

import msgspec
from msgspec.structs import replace

from kvdoctor.engines.mlx_lm.plan import LayerCache
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.model import ModelSpec

BASE, DIGITS = 128, 3  # canary positions up to 128**3 (2M tokens)
SHORT = 5  # tokens of the short request in the merge
DECODES = 2
MLX_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "BF16": "bfloat16",
              "F16": "float16", "F32": "float32"}


class Group(msgspec.Struct, frozen=True):
    """Layers whose caches are built alike, and the shapes they are built with."""

    cache: LayerCache
    layers: tuple[int, ...]
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: str

    @property
    def tokens(self) -> int:
        """The longest request the probe feeds: past the window for a rotating cache."""
        return (self.cache.max_size or self.cache.chunk_size or 8) + 3 + DECODES

    def nbytes(self) -> int:
        itemsize = 4 if self.dtype == "float32" else 2
        return 2 * self.tokens * self.n_kv_heads * (self.head_dim + self.v_head_dim) * itemsize


class Outcome(msgspec.Struct, frozen=True, omit_defaults=True, rename={"cls": "class"}):
    outcome: str  # ok | error
    cls: str | None = None
    message: str | None = None
    detail: Any = None


class Driven(msgspec.Struct, frozen=True, omit_defaults=True):
    """What one group's real cache did."""

    mlx_class: str
    layers: tuple[int, ...]
    shape: tuple[int, int, int]  # (kv heads, head size, value head size)
    dtype: str
    window: Outcome | None = None  # held positions after the window wrapped
    quantize: Outcome | None = None
    trim: Outcome | None = None
    merge: Outcome | None = None


class CacheDrive(msgspec.Struct, frozen=True):
    groups: tuple[Driven, ...] = ()
    skipped: str | None = None


def groups(spec: ModelSpec, caches: tuple[LayerCache, ...]) -> list[Group]:
    found: dict[tuple, list[int]] = {}
    shapes: dict[tuple, tuple[int, int, int, str]] = {}
    for cache in caches:
        if cache.cls is None:
            continue
        layer = spec.layers[cache.layer]
        if layer.kv_lora_rank:  # MLA: mlx-lm caches the latent and the rope key as one head
            heads, dim, vdim = 1, layer.kv_lora_rank + (layer.qk_rope_head_dim or 0), layer.kv_lora_rank
        else:
            heads, dim = layer.n_kv_heads or 1, layer.head_dim or 64
            vdim = layer.v_head_dim or dim
        dtype = MLX_DTYPES.get(layer.dtype or spec.dtype or "bfloat16", "bfloat16")
        key = (replace(cache, layer=-1), heads, dim, vdim, dtype)
        found.setdefault(key, []).append(cache.layer)
        shapes[key] = (heads, dim, vdim, dtype)
    return [Group(replace(key[0], layer=layers[0]), tuple(layers), *shapes[key]) for key, layers in found.items()]


def _attempt(call: Callable[[], Any]) -> Outcome:
    try:
        detail = call()
    except Exception as exc:  # noqa: BLE001 - mlx-lm's own error is the observation
        return Outcome("error", type(exc).__name__, str(exc))
    return Outcome("ok", detail=detail)


def _new(cache: LayerCache) -> Any:
    from mlx_lm.models import cache as mc

    if cache.cls == "RotatingKVCache":
        return mc.RotatingKVCache(max_size=cache.max_size, keep=cache.keep or 0)
    if cache.cls == "ChunkedKVCache":
        return mc.ChunkedKVCache(cache.chunk_size)
    if cache.cls == "ArraysCache":
        return mc.ArraysCache(size=2)
    if cache.cls == "CacheList":
        return mc.CacheList(*(_new(LayerCache(cache.layer, part)) for part in cache.parts))
    return mc.KVCache()


def _canary(start: int, count: int, width: int, dtype: Any) -> Any:
    """(count, width) rows for positions start..: the position in base 128 over the first lanes, exact in
    every float dtype (bfloat16 holds integers up to 256 exactly), the other lanes zero."""
    import mlx.core as mx

    pos = mx.arange(start, start + count)
    digits = [(pos // BASE**i) % BASE for i in range(DIGITS)][:width]
    lanes = mx.stack(digits, axis=1).astype(dtype)
    return mx.concatenate([lanes, mx.zeros((count, width - lanes.shape[1]), dtype=dtype)], axis=1)


def _feed(obj: Any, group: Group, start: int, count: int) -> None:
    """`count` tokens from position `start`: keys and values that carry their position (`_canary`)."""
    import mlx.core as mx

    dtype = getattr(mx, group.dtype)
    if hasattr(obj, "caches"):
        for part in obj.caches:
            _feed(part, group, start, count)
        return
    if obj.__class__.__name__ == "ArraysCache":
        obj[0] = mx.full((1, 3, 4), float(start + count), dtype=dtype)
        obj[1] = mx.full((1, 2, 4), float(start + count), dtype=dtype)
        return
    keys = mx.broadcast_to(_canary(start, count, group.head_dim, dtype)[None, None],
                           (1, group.n_kv_heads, count, group.head_dim))
    values = mx.broadcast_to(_canary(start, count, group.v_head_dim, dtype)[None, None],
                             (1, group.n_kv_heads, count, group.v_head_dim))
    obj.update_and_fetch(keys, values)


def _held(obj: Any) -> list[int]:
    rows = obj.state[0][0, 0, :, :DIGITS].tolist()
    return sorted(sum(int(lane) * BASE**i for i, lane in enumerate(row)) for row in rows)


def drive(group: Group, settings: MlxLmSettings) -> Driven:
    from mlx_lm.generate import _merge_caches, maybe_quantize_kv_cache

    cache = group.cache
    long = _new(cache)
    prompt = group.tokens - DECODES
    _feed(long, group, 0, prompt)
    for step in range(DECODES):
        _feed(long, group, prompt + step, 1)
    window = None
    if cache.cls == "RotatingKVCache" and cache.max_size is not None:
        keep = cache.keep or 0
        want = list(range(keep)) + list(range(group.tokens - (cache.max_size - keep), group.tokens))
        held = _held(long)
        window = Outcome("ok" if held == want else "error", detail={"held": _ranges(held), "expected": _ranges(want)})
    fresh = _new(cache)
    _feed(fresh, group, 0, 3)
    trim = _attempt(lambda: {"before_wrap": fresh.is_trimmable(), "trimmed": fresh.trim(2) if fresh.is_trimmable()
                             else 0, "after_wrap": long.is_trimmable()})
    quantize = None
    if settings.kv_bits is not None:
        def quantized() -> str:
            held = [_new(cache)]
            _feed(held[0], group, 0, 3)
            maybe_quantize_kv_cache(held, 0, settings.kv_group_size, settings.kv_bits)
            _feed(held[0], group, 3, 1)
            return type(held[0]).__name__
        quantize = _attempt(quantized)
    short = _new(cache)
    _feed(short, group, 0, SHORT)
    merge = _attempt(lambda: [type(c).__name__ for c in _merge_caches([[_new(cache)], [short], [long]])])
    return Driven(cache.cls or "", group.layers, (group.n_kv_heads, group.head_dim, group.v_head_dim), group.dtype,
                  window=window, quantize=quantize, trim=trim, merge=merge)


def _ranges(positions: list[int]) -> str:
    """Positions as runs: "0-3, 10-20"."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def run_drives(chosen: list[Group], settings: MlxLmSettings) -> CacheDrive:
    from kvdoctor.engines.sglang_mlx.mlxlm import use_cheap_import

    use_cheap_import()
    return CacheDrive(groups=tuple(drive(group, settings) for group in chosen))
