"""POOL001-POOL003: the full-attention pool index map the fused RoPE + pool-scatter decode kernel
addresses buffers with. Builds the pool with real shapes and runs the emulated kernel (kvdoctor.mlx.pool)."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.context import Context
from kvdoctor.engines.sglang_mlx import MlxFacts
from kvdoctor.limits import require_within_budget
from kvdoctor.model import Finding

MISSING_MAP = ("BatchedDecodeContext requires full_kv_pool_index_by_layer when the fused AOT RoPE + "
               "pool-scatter kernel is active")
SETTING = "sglang_mlx.full_kv_pool_index_by_layer"


def run(ctx: Context) -> Iterable[Finding]:
    facts: MlxFacts = ctx.plan.data["sglang_mlx"]
    settings = ctx.deploy.sglang_mlx
    if not facts.serves or not facts.layout.full or not settings.radix_cache:
        return
    layout, fused = facts.layout, facts.fused
    summary = ctx.plan.data["report"].setdefault("sglang_mlx", {})
    supplied = settings.full_kv_pool_index_by_layer
    if not fused.active:
        if supplied is not None:
            ctx.plan.data["report"]["engine_notes"].append(
                f"{SETTING} is not used: the fused RoPE + pool-scatter kernel is off ({_off_reason(fused)})")
        return
    from kvdoctor.mlx.pool import pool_bytes, probe_pool

    kv = facts.kv[layout.full[0]]
    rope = facts.view.layers[layout.attention[0]].rope
    size = pool_bytes(len(layout.full), facts.pool_slots, kv.n_kv_heads, kv.head_dim, _size(kv.dtype))
    require_within_budget(f"sglang-mlx pool for {len(layout.full)} full-attention layers", size,
                          ctx.deploy.source("sglang_mlx.pool_size"))

    def scatter(index_map: dict[int, int]):
        return probe_pool(layout.full, index_map, kv.n_kv_heads, kv.head_dim, kv.dtype, rope.dims, rope.base,
                          facts.pool_slots)

    stock = ("" if facts.stock_pool else
             " (sglang 0.5.23's own runner builds no pool for a model with sliding layers, which keeps this kernel "
             "off; a runner that keeps a pool meets this)")
    where = ctx.deploy.source(SETTING)
    if supplied is None:
        readback = scatter(layout.full_pool_index)
        summary["pool_probe"] = {"map": "derived from the layout", "clean": readback.clean, "slots": readback.slots}
        return
    if not supplied:
        default = {layer: layout.attention_index[layer] for layer in layout.full}
        readback = scatter(default)
        summary["pool_probe"] = {"map": "none (the cache index as a fallback)", "clean": readback.clean,
                                 "slots": readback.slots}
        yield Finding.at(
            "POOL001",
            f"the fused RoPE + pool-scatter kernel is on ({fused.reason}) and the decode context gets no "
            f"{SETTING.rpartition('.')[2]}: the backend refuses at the first batched decode. Falling back to "
            f"the per-cache index instead, {_consequences(readback, len(layout.full))}{stock}",
            where, layer=(readback.overwrites[0]["writer"] if readback.overwrites else None),
            engine_error={"class": "ValueError", "message": MISSING_MAP, "stage": "decode"},
            evidence={"full_layers": layout.full, "expected_map": layout.full_pool_index, "fallback_map": default,
                      "overwrites": readback.overwrites, "past_end": readback.past_end})
        return
    readback = scatter(supplied)
    summary["pool_probe"] = {"map": "from the deploy file", "clean": readback.clean, "slots": readback.slots}
    evidence = {"full_layers": layout.full, "expected_map": layout.full_pool_index, "map": supplied}
    if readback.overwrites:
        first = readback.overwrites[0]
        yield Finding.at("POOL002", f"the deploy file's {SETTING.rpartition('.')[2]} sends full-attention layers "
                         f"into other layers' pool buffers: {_overwrites(readback.overwrites)}. Those K/V land in "
                         f"the wrong layer's slots and a later radix prefix hit reads them back{stock}", where,
                         layer=first["writer"], evidence={**evidence, "overwrites": readback.overwrites})
    if readback.missing or readback.past_end:
        parts = []
        if readback.missing:
            parts.append(f"has no entry for full layers {readback.missing} (KeyError at the first decode)")
        if readback.past_end:
            bad = ", ".join(f"layer {p['layer']} -> {p['index']}" for p in readback.past_end)
            parts.append(f"points past the {len(layout.full)} pool buffers ({bad}; IndexError)")
        layer = (readback.missing or [p["layer"] for p in readback.past_end])[0]
        yield Finding.at("POOL003", f"the deploy file's {SETTING.rpartition('.')[2]} " + " and ".join(parts) + stock,
                         where, layer=layer,
                         evidence={**evidence, "missing": readback.missing, "past_end": readback.past_end})


def _size(dtype: str) -> int:
    import mlx.core as mx

    return getattr(mx, dtype).size


def _off_reason(fused) -> str:
    return "SGLANG_MLX_USE_CUSTOM_ROPE is not set" if not fused.requested else fused.reason


def _overwrites(records: list[dict[str, int]], limit: int = 4) -> str:
    text = ", ".join(f"layer {r['writer']} would overwrite layer {r['owner']}'s buffer" for r in records[:limit])
    return text + (f" and {len(records) - limit} more" if len(records) > limit else "")


def _consequences(readback, buffers: int) -> str:
    if readback.clean:
        return "would happen to address the right buffers here (no sliding layer precedes a full layer)"
    parts = []
    if readback.overwrites:
        parts.append(_overwrites(readback.overwrites))
    if readback.past_end:
        layers = [p["layer"] for p in readback.past_end]
        parts.append(f"layers {layers[0]}..{layers[-1]} would index past the {buffers} buffers (IndexError)")
    return "; ".join(parts)
