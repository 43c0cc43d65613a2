"""The shared full-attention KV pool and an emulated fused RoPE + pool-scatter decode step.

The backend keeps one `(pool_size + 1, n_kv_heads, head_dim)` key buffer and one value buffer per
full-attention layer (slot 0 is padding). Prefill sync writes buffer i for the i-th full layer;
the fused decode kernel rotates each full layer's new key with RoPE at every request's own offset
and scatters it into `buffer[index_map[layer]]`. The Metal kernel exists only on macOS, so this
emulates it with `mx.fast.rope` and an array scatter, then reads every buffer back. Values carry
canaries (writer layer, position) so each slot tells who wrote it.
"""
from __future__ import annotations

from typing import Any

import msgspec

CANARY_BASE = 64
PREFIX_LENGTHS = (3, 5)  # two requests with different prefixes: per-request RoPE offsets differ
MIN_SLOTS = sum(PREFIX_LENGTHS) + len(PREFIX_LENGTHS)


class PoolReadback(msgspec.Struct):
    buffers: int
    slots: int
    overwrites: list[dict[str, int]] = msgspec.field(default_factory=list)  # writer layer -> another layer's buffer
    past_end: list[dict[str, int]] = msgspec.field(default_factory=list)  # layer -> index outside the buffer list
    missing: list[int] = msgspec.field(default_factory=list)  # full layers with no entry in the map
    unwritten: list[int] = msgspec.field(default_factory=list)  # layers whose own new-token slot stayed empty
    rope_mismatch: list[int] = msgspec.field(default_factory=list)  # buffers whose keys are not rotated at the slot's position
    bytes: int = 0

    @property
    def clean(self) -> bool:
        return not (self.overwrites or self.past_end or self.missing or self.unwritten or self.rope_mismatch)


def pool_bytes(full_layers: int, slots: int, n_kv_heads: int, head_dim: int, dtype_size: int) -> int:
    return 2 * full_layers * (slots + 1) * n_kv_heads * head_dim * dtype_size


def _canary(layer: int, positions: list[int], n_kv_heads: int, head_dim: int, dtype: Any) -> Any:
    """[len(positions), n_kv, head_dim]: lanes 0-2 hold layer + 1, lanes 3-5 the position (base-64 digits)."""
    import mlx.core as mx

    rows = []
    for p in positions:
        digits = [((layer + 1) // CANARY_BASE ** d) % CANARY_BASE for d in range(3)]
        digits += [(p // CANARY_BASE ** d) % CANARY_BASE for d in range(3)]
        rows.append(digits + [0] * (head_dim - 6))
    lanes = mx.array(rows, dtype=mx.float32).astype(dtype)
    return mx.broadcast_to(lanes[:, None, :], (len(positions), n_kv_heads, head_dim))


def _read_canary(row: Any) -> tuple[int, int]:
    """(layer, position) from one slot's first KV head; layer -1 for an empty slot."""
    import mlx.core as mx

    lanes = [round(v) for v in row[0, :6].astype(mx.float32).tolist()]
    layer = sum(v * CANARY_BASE ** d for d, v in enumerate(lanes[:3])) - 1
    return layer, sum(v * CANARY_BASE ** d for d, v in enumerate(lanes[3:]))


def _rotate(keys: Any, offset: Any, dims: int, base: float) -> Any:
    """RoPE the fused kernel applies: plain, non-traditional, over `dims` of the head, at `offset`."""
    import mlx.core as mx

    return mx.fast.rope(keys, dims, traditional=False, base=base, scale=1.0, offset=offset)


def probe_pool(full_layers: list[int], index_map: dict[int, int], n_kv_heads: int, head_dim: int, dtype: str,
               rope_dims: int, rope_base: float, slots: int) -> PoolReadback:
    """Prefill-sync two requests, run one fused decode step with `index_map`, read every buffer back."""
    import mlx.core as mx

    if head_dim < 6:
        raise ValueError("the pool canary needs a head_dim of at least 6")
    mx_dtype = getattr(mx, dtype)
    slots = max(slots, MIN_SLOTS)
    n = len(full_layers)
    keys = [mx.zeros((slots + 1, n_kv_heads, head_dim), dtype=mx_dtype) for _ in range(n)]
    values = [mx.zeros((slots + 1, n_kv_heads, head_dim), dtype=mx_dtype) for _ in range(n)]
    out = PoolReadback(buffers=n, slots=slots, bytes=pool_bytes(n, slots, n_kv_heads, head_dim, mx_dtype.size))

    # Slot 0 is padding; each request's prefix takes the next slots, then each request one new slot.
    prefix_slots, next_slot = [], 1
    for length in PREFIX_LENGTHS:
        prefix_slots.append(list(range(next_slot, next_slot + length)))
        next_slot += length
    new_slots = list(range(next_slot, next_slot + len(PREFIX_LENGTHS)))
    expected: dict[tuple[int, int], tuple[int, int]] = {}  # (buffer, slot) -> (owner layer, position)

    # Prefill sync: dense full-layer order, buffer i <- i-th full layer.
    for i, layer in enumerate(full_layers):
        for taken in prefix_slots:
            positions = list(range(len(taken)))
            v = _canary(layer, positions, n_kv_heads, head_dim, mx_dtype)
            k = _rotate(v.transpose(1, 0, 2)[None], 0, rope_dims, rope_base)[0].transpose(1, 0, 2)
            index = mx.array(taken)
            keys[i][index] = k
            values[i][index] = v
            expected.update({(i, s): (layer, p) for s, p in zip(taken, positions)})

    # One fused decode step: every request's new token at its own offset, scattered via the map.
    offsets = mx.array(list(PREFIX_LENGTHS), dtype=mx.int32)
    slot_index = mx.array(new_slots)
    for i, layer in enumerate(full_layers):
        expected.update({(i, s): (layer, p) for s, p in zip(new_slots, PREFIX_LENGTHS)})
        if layer not in index_map:
            out.missing.append(layer)
            continue
        target = index_map[layer]
        if not -n <= target < n:
            out.past_end.append({"layer": layer, "index": target})
            continue
        v = mx.concatenate([_canary(layer, [p], n_kv_heads, head_dim, mx_dtype) for p in PREFIX_LENGTHS])
        k = _rotate(v[:, :, None, :], offsets, rope_dims, rope_base)[:, :, 0, :]
        keys[target][slot_index] = k
        values[target][slot_index] = v
    mx.eval(keys, values)

    for (buffer, slot), (owner, _position) in sorted(expected.items()):
        writer, written_at = _read_canary(values[buffer][slot])
        if writer == -1:
            if owner not in out.unwritten:
                out.unwritten.append(owner)
            continue
        if writer != owner:
            record = {"writer": writer, "buffer": buffer, "owner": owner}
            if record not in out.overwrites:
                out.overwrites.append(record)
            continue
        want = _rotate(values[buffer][slot][None, :, None, :], written_at, rope_dims, rope_base)[0, :, 0]
        close = mx.allclose(want.astype(mx.float32), keys[buffer][slot].astype(mx.float32), rtol=1e-2, atol=1e-2)
        if not close.item() and buffer not in out.rope_mismatch:
            out.rope_mismatch.append(buffer)
    return out
