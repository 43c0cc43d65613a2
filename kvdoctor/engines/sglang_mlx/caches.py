"""kvdoctor's own per-request KV caches with the contract of sglang 0.5.23's MLX backend.

Layout is mlx-lm's `[1, n_kv_heads, T, head_dim]`. Every cache keeps `offset` = tokens ever
written (absolute: it seeds RoPE positions and decode bookkeeping) and answers `make_mask(N, ...)`
for the N queries about to be written, with a mask as wide as the keys `update_and_fetch` will
return in the same forward pass.

An `observer` (the probes) may watch mask requests and stores. Without one, a cache refuses what
the backend refuses, with the backend's exception class and text.
"""
from __future__ import annotations

from typing import Any, Protocol

# Exact engine texts (sglang 0.5.23, kv_cache/attention_kv_cache.py).
FULL_MASK_FROM_WINDOW = ("WindowedAttentionKVCache holds only the trailing window and "
                         "cannot serve a full-context attention mask")
SHIM_STORES = "AttentionOffsetCache should not store data"

GROWTH_BLOCK = 256  # the contiguous buffer grows in blocks of this many tokens
CANARY_BASE = 64  # positions are written as base-64 digits: exact in bfloat16 and float16


class Observer(Protocol):
    def on_mask(self, cache: Any, n: int, window_size: int | None, mask: Any, refused: bool) -> Any: ...

    def on_shim_store(self, shim: "OffsetShim", keys: Any) -> None: ...


def attention_mask(n: int, offset: int, window_size: int | None = None, return_array: bool = False) -> Any:
    """The mask for n queries following `offset` cached keys, in the forms mlx-lm containers accept.

    A window only needs a band when it can bind (offset + n > window); otherwise a plain causal mask
    sees the same keys. One query with no band needs no mask at all.
    """
    from mlx_lm.models.base import create_causal_mask

    if window_size is not None and offset + n > window_size:
        return create_causal_mask(n, offset, window_size=window_size)
    if n == 1:
        return None
    if return_array:
        return create_causal_mask(n, offset)
    return "causal"


class ContiguousKVCache:
    """A full-attention layer's cache: every token of the request, in order, in a growing buffer.

    (sglang starts at 4096 tokens and doubles; the probes only need the same contents, so the
    buffer grows in small blocks to keep their memory down.)
    """

    kind = "contiguous"

    def __init__(self, layer: int, observer: Observer | None = None):
        self.layer = layer
        self.window = None
        self.offset = 0
        self.keys = None
        self.values = None
        self.observer = observer

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        mask = attention_mask(n, self.offset, window_size, return_array)
        if self.observer is not None:
            self.observer.on_mask(self, n, window_size, mask, False)
        return mask

    def _ensure_room(self, keys: Any, needed: int) -> None:
        import mlx.core as mx

        if self.keys is not None and needed <= self.keys.shape[2]:
            return
        capacity = -(-needed // GROWTH_BLOCK) * GROWTH_BLOCK
        b, heads, _, dim = keys.shape
        new_k = mx.zeros((b, heads, capacity, dim), dtype=keys.dtype)
        new_v = mx.zeros((b, heads, capacity, dim), dtype=keys.dtype)
        if self.keys is not None and self.offset:
            new_k[:, :, : self.offset, :] = self.keys[:, :, : self.offset, :]
            new_v[:, :, : self.offset, :] = self.values[:, :, : self.offset, :]
        self.keys, self.values = new_k, new_v

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        end = self.offset + keys.shape[2]
        self._ensure_room(keys, end)
        self.keys[:, :, self.offset:end, :] = keys
        self.values[:, :, self.offset:end, :] = values
        self.offset = end
        return self.keys[:, :, :end, :], self.values[:, :, :end, :]

    def write_token(self, keys: Any, values: Any) -> None:
        self.update_and_fetch(keys, values)

    def get_kv(self, window: int | None = None) -> tuple[Any, Any]:
        """The keys batched decode reads: all of them, or the trailing `window`."""
        start = 0 if window is None else max(0, self.offset - window)
        return self.keys[:, :, start:self.offset, :], self.values[:, :, start:self.offset, :]

    @property
    def state(self) -> tuple:
        return () if self.keys is None else (self.keys, self.values)


class WindowedKVCache:
    """A sliding layer's cache: the last `window` tokens plus the chunk being written, in order.

    `offset` stays absolute while `local` counts the tokens physically buffered. A forward pass
    gets back min(local, window) older keys plus its chunk, so a warmed-up decode step sees W + 1
    keys and its mask must hide the oldest one.
    """

    kind = "windowed"

    def __init__(self, layer: int, window: int, observer: Observer | None = None):
        self.layer = layer
        self.window = window
        self.offset = 0
        self.local = 0
        self.keys = None
        self.values = None
        self.observer = observer

    def kept(self) -> int:
        return min(self.local, self.window)

    def refuses_full_mask(self, window_size: int | None) -> bool:
        """A full-context mask is impossible once older keys are (logically) gone."""
        return window_size is None and self.offset > self.kept()

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        refused = self.refuses_full_mask(window_size)
        if refused and self.observer is None:
            raise RuntimeError(FULL_MASK_FROM_WINDOW)
        # Never the one-query shortcut: with `kept` == W the query sees W + 1 keys and needs the band.
        mask = attention_mask(n, self.kept(), window_size, return_array)
        if self.observer is not None:
            return self.observer.on_mask(self, n, window_size, mask, refused)
        return mask

    def _append(self, keys: Any, values: Any) -> tuple[int, int]:
        import mlx.core as mx

        s = keys.shape[2]
        kept = self.kept()
        capacity = self.window + max(s, self.window)
        held = 0 if self.keys is None else self.keys.shape[2]
        if self.local + s > held or held > capacity:
            # Re-home the trailing `kept` tokens at the start of a right-sized buffer.
            b, heads, _, dim = keys.shape
            new_k = mx.zeros((b, heads, capacity, dim), dtype=keys.dtype)
            new_v = mx.zeros((b, heads, capacity, dim), dtype=keys.dtype)
            if kept:
                new_k[:, :, :kept, :] = self.keys[:, :, self.local - kept:self.local, :]
                new_v[:, :, :kept, :] = self.values[:, :, self.local - kept:self.local, :]
            self.keys, self.values, self.local = new_k, new_v, kept
        start, end = self.local - kept, self.local + s
        self.keys[:, :, self.local:end, :] = keys
        self.values[:, :, self.local:end, :] = values
        self.local = end
        self.offset += s
        return start, end

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        start, end = self._append(keys, values)
        return self.keys[:, :, start:end, :], self.values[:, :, start:end, :]

    def write_token(self, keys: Any, values: Any) -> None:
        self._append(keys, values)

    def get_kv(self, window: int | None = None) -> tuple[Any, Any]:
        """Batched decode's read: the trailing `window` buffered keys (buffer-relative, not absolute)."""
        start = 0 if window is None else max(0, self.local - window)
        return self.keys[:, :, start:self.local, :], self.values[:, :, start:self.local, :]

    @property
    def state(self) -> tuple:
        return () if self.keys is None else (self.keys, self.values)


class OffsetShim:
    """Batched decode's per-layer stand-in: only an offset, so the container can still build masks.

    The attention wrapper serves attention itself during batched decode; anything that tries to
    store keys in the shim is a module the wrapper does not cover.
    """

    kind = "shim"

    def __init__(self, layer: int, offset: int, observer: Observer | None = None):
        self.layer = layer
        self.offset = offset
        self.observer = observer

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        return attention_mask(n, self.offset, window_size, return_array)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        if self.observer is None:
            raise RuntimeError(SHIM_STORES)
        self.observer.on_shim_store(self, keys)
        return keys, values

    @property
    def state(self) -> tuple:
        return ()


def canary(positions: range, n_kv_heads: int, head_dim: int, dtype: Any) -> Any:
    """Keys whose every head carries its absolute position, as base-64 digits in the first lanes."""
    import mlx.core as mx

    pos = mx.arange(positions.start, positions.stop, dtype=mx.int32)
    lanes = []
    for digit in range(min(3, head_dim)):
        lanes.append((pos // (CANARY_BASE ** digit)) % CANARY_BASE)
    digits = mx.stack(lanes, axis=-1).astype(dtype)  # [S, d]
    if head_dim > digits.shape[-1]:
        digits = mx.concatenate([digits, mx.zeros((digits.shape[0], head_dim - digits.shape[-1]), dtype)], -1)
    return mx.broadcast_to(digits[None, None], (1, n_kv_heads, digits.shape[0], head_dim))


def positions_of(keys: Any) -> Any:
    """Absolute positions written into canary keys (read from the first KV head), as a numpy array."""
    import mlx.core as mx
    import numpy as np

    lanes = np.array(keys[0, 0, :, : min(3, keys.shape[-1])].astype(mx.float32))
    weights = CANARY_BASE ** np.arange(lanes.shape[-1])
    return np.rint(lanes).astype(np.int64) @ weights
