"""POOL001-POOL003: the full-attention pool index map the fused RoPE + pool-scatter decode kernel
addresses buffers with, as the pool probe (real shapes, the emulated kernel) read it back."""
from __future__ import annotations

from typing import Any, Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding

# The profile is imported when the rule runs (it brings pydantic); the probe's name and the setting
# are its PoolProbe.name and POOL_MAP_SETTING (a test holds them equal).
RULE = Rule(codes=("POOL001", "POOL002", "POOL003"), engines=("sglang-mlx",), needs=("probe:pool",))

MISSING_MAP = ("BatchedDecodeContext requires full_kv_pool_index_by_layer when the fused AOT RoPE + "
               "pool-scatter kernel is active")
SETTING = "sglang_mlx.full_kv_pool_index_by_layer"


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang_mlx.profile import SGLANG_VERSION, PoolProbe, PoolRun, mlx_facts

    seen = ctx.observations.get(PoolProbe.name)
    if not isinstance(seen, PoolRun) or seen.readback is None or seen.map == "derived":
        return
    facts = mlx_facts(ctx.plan)
    layout, fused, readback = facts.layout, facts.fused, seen.readback
    assert layout is not None and fused is not None
    stock = ("" if facts.stock_pool else
             f" (sglang {SGLANG_VERSION}'s own runner builds no pool for a model with sliding layers, which keeps this kernel "
             "off; a runner that keeps a pool meets this)")
    where = ctx.deploy.source(SETTING)
    if seen.map == "fallback":
        yield Finding.at(
            "POOL001",
            f"the fused RoPE + pool-scatter kernel is on ({fused.reason}) and the decode context gets no "
            f"{SETTING.rpartition('.')[2]}: the backend refuses at the first batched decode. Falling back to "
            f"the per-cache index instead, {_consequences(readback, len(layout.full))}{stock}",
            where, layer=(readback.overwrites[0]["writer"] if readback.overwrites else None),
            engine_error={"class": "ValueError", "message": MISSING_MAP, "stage": "decode"},
            evidence={"full_layers": layout.full, "expected_map": layout.full_pool_index,
                      "fallback_map": dict(seen.index_map), "overwrites": readback.overwrites,
                      "past_end": readback.past_end})
        return
    supplied = dict(seen.index_map)
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


def _overwrites(records: list[dict[str, int]], limit: int = 4) -> str:
    text = ", ".join(f"layer {r['writer']} would overwrite layer {r['owner']}'s buffer" for r in records[:limit])
    return text + (f" and {len(records) - limit} more" if len(records) > limit else "")


def _consequences(readback: Any, buffers: int) -> str:
    if readback.clean:
        return "would happen to address the right buffers here (no sliding layer precedes a full layer)"
    parts = []
    if readback.overwrites:
        parts.append(_overwrites(readback.overwrites))
    if readback.past_end:
        layers = [p["layer"] for p in readback.past_end]
        parts.append(f"layers {layers[0]}..{layers[-1]} would index past the {buffers} buffers (IndexError)")
    return "; ".join(parts)
