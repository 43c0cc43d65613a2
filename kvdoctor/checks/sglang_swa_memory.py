"""A model SGLang keeps out of hybrid-SWA memory (not on its allow-list, or `disable_hybrid_swa_memory`) while
its sliding layers would only need a window: those layers hold full-length KV slots in the one pool (SGL011,
a warning with what that costs, from the profile's own sizing model). Whether the window is still applied
is said too; where SGLang's attention does not mask it at all, SGL004 (an error) reports that separately."""
from __future__ import annotations

from typing import Any, Iterable

import msgspec

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import CHUNKED, NO_ATTENTION, SLIDING, Finding

RULE = Rule(codes=("SGL011",), engines=("sglang",))
WINDOWED = (SLIDING, CHUNKED)  # a chunked layer (Llama-4) needs no more than its chunk either
WHY = {"not-on-allow-list": "is not on its hybrid-SWA allow-list",
       "disabled-by-flag": "runs with disable_hybrid_swa_memory"}


def _bytes(buffer: dict[str, Any] | None) -> int:
    """Bytes one token costs in one layer of that per-token buffer description."""
    if not buffer:
        return 0
    from kvdoctor.engines.budget.facts import dtype_bytes

    size = dtype_bytes(buffer["dtype"])
    rows = [buffer[k] for k in ("k_buffer", "v_buffer", "kv_buffer") if k in buffer]
    return sum(r[0] * r[1] for r in rows) * size


def _tokens_without_sliding(ctx: Context, settings: Any, why: str) -> tuple[int | None, str]:
    """Full-pool tokens at kv_budget if the sliding layers took no full-length slots: SGLang's own split with
    the flag off (exact, the sizing model), or the full layers alone (an upper bound: no SWA pool counted)."""
    from kvdoctor.engines.sglang.layout import plan_layers

    if why == "disabled-by-flag":
        _, refused, facts = plan_layers(ctx.spec, settings.model_copy(update={"disable_hybrid_swa_memory": False}))
        pools = (facts.budget or {}).get("pools") or {}
        return (None if refused else pools.get("full")), "with hybrid-SWA memory on (its own full / SWA split)"
    kept = [msgspec.structs.replace(layer, kind=NO_ATTENTION) if layer.kind in WINDOWED else layer
            for layer in ctx.spec.layers]  # a layer with no token mixer takes no pool slot
    if all(layer.kind == NO_ATTENTION for layer in kept):
        return None, "with no full-attention layer, no full pool to compare with"  # every layer windowed
    _, _, facts = plan_layers(msgspec.structs.replace(ctx.spec, layers=kept), settings)
    pools = (facts.budget or {}).get("pools") or {}
    return pools.get("full"), "at most, if only the full-attention layers held full-length slots"


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang.profile import pool_facts
    from kvdoctor.engines.sglang.refusals import derived_context_length

    facts = pool_facts(ctx.plan)
    if facts is None or facts.hybrid_swa or facts.hybrid_swa_why not in WHY or ctx.plan.refusals:
        return
    sliding = [layer for layer in ctx.spec.layers if layer.kind in WINDOWED and layer.window]
    context = getattr(ctx.settings, "context_length", None) or derived_context_length(ctx.spec)
    if not sliding or context <= min(layer.window or 0 for layer in sliding):
        return  # no request outgrows the window: full-length slots cost nothing a window would save
    planned = {lp.index: lp for lp in ctx.plan.layers}
    masked = [layer.index for layer in sliding if planned[layer.index].engine_window == layer.window]
    per_layer = _bytes(facts.pools.get("attention_buffer_per_token"))
    attention = sum(1 for lp in ctx.plan.layers if lp.cache in ("full", "swa", "mla"))
    evidence: dict[str, Any] = {
        "why": facts.hybrid_swa_why, "sliding_layers": [layer.index for layer in sliding],
        "window": sorted({layer.window for layer in sliding}), "context": context,
        "sliding_bytes_per_token": per_layer * len(sliding), "pool_bytes_per_token": per_layer * attention,
        "tp_size": facts.pools.get("tp_size"), "masks_window": len(masked) == len(sliding),
        "unmasked_layers": [layer.index for layer in sliding if layer.index not in masked]}
    cost = (f"{per_layer * len(sliding)} of the pool's {per_layer * attention} bytes per token per rank go to "
            f"{len(sliding)} windowed layers")
    budget = facts.budget or {}
    served = (budget.get("pools") or {}).get("full")
    if served:
        alt, how = _tokens_without_sliding(ctx, ctx.settings, facts.hybrid_swa_why)
        evidence.update(pool_tokens=served, pool_tokens_without_full_length_sliding=alt, kv_budget=budget.get("kv_budget"))
        if alt and alt > served:
            lost = "tokens lost" if facts.hybrid_swa_why == "disabled-by-flag" else "tokens lost at most"
            cost += f"; at kv_budget the pool holds {served} tokens, {alt} {how} ({alt - served} {lost})"
    if masked and len(masked) == len(sliding):
        mask = "its attention still masks the window, so answers do not change"
    elif masked:
        mask = f"its attention masks the window on {len(masked)} of them only (SGL004 reports the others)"
    else:
        mask = "its attention does not mask the window at all (SGL004 reports that)"
    what = "chunked-attention" if all(layer.kind == CHUNKED for layer in sliding) else "sliding"
    yield Finding.at("SGL011", f"sglang {ctx.plan.versions.get('sglang')}'s {facts.architecture} "
                     f"{WHY[facts.hybrid_swa_why]}: {len(sliding)} {what} layers (window "
                     f"{'/'.join(map(str, evidence['window']))}) keep full-length KV slots for a context of "
                     f"{context}; {cost}; {mask}", ctx.spec.key_source("sliding_window"), layer=sliding[0].index,
                     evidence=evidence)
