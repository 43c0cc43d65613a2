"""MEM016: the deploy file's GPUs and layout do not serve the context and concurrency it asks for.

Runs when the deploy file's `budget:` section names a GPU (`gpu` or `gpu_memory`) and the checked engine has a
fit model: the engine's profile prices the deploy's own layout (`EngineProfile.fit`, the arithmetic of
`kvdoctor fit`) and the finding gives what it serves next to what was asked.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from kvdoctor.checks import Rule
from kvdoctor.model import Finding

RULE = Rule(codes=("MEM016",))

if TYPE_CHECKING:
    from kvdoctor.checks.context import Context


def run(ctx: Context) -> Iterable[Finding]:
    asked = ctx.deploy.budget
    if asked is None or (asked.gpu is None and asked.gpu_memory is None):
        return []
    from kvdoctor.engines import fit_engines, profile
    from kvdoctor.engines.budget.fit import Request, gpu, layout_of
    from kvdoctor.errors import InputError

    if ctx.engine not in fit_engines() or ctx.spec.checkpoint is None or not ctx.spec.checkpoint.tensors:
        return []
    section = {k: v for k, v in ctx.deploy.settings(ctx.engine).model_dump().items() if v is not None}
    layout = layout_of(section) or {"tp": 1, "pp": 1, "dp": 1}
    kv_dtype = section.get("kv_cache_dtype")
    request = Request(context=asked.context or section.get("max_model_len") or section.get("context_length"),
                      concurrency=asked.concurrency,
                      kv_cache_dtype=kv_dtype if kv_dtype not in (None, "auto") else None)
    prof = profile(ctx.engine)
    try:
        facts = prof.budget_facts(ctx.spec)
        device = gpu(asked.gpu, None if asked.gpu_memory is None else str(asked.gpu_memory))
        row = prof.fit(ctx.spec, facts, device, layout, request, section)
    except InputError:
        return []  # `kvdoctor fit` says why this model cannot be priced
    if row.fits:
        return []
    where = ctx.deploy.source("budget.concurrency" if asked.concurrency else "budget.context")
    shape = f"{row.gpus} x {row.gpu} ({', '.join(f'{k} {v}' for k, v in row.layout.items())})"
    if row.refusal is not None:
        message = (f"{row.engine} {row.version} on {shape} would not start for a context of {row.context:,}: "
                   f"{row.refusal.cls}: {row.refusal.message}")
    else:
        message = (f"{row.engine} {row.version} on {shape} serves {row.max_concurrency or 0:.2f} requests of "
                   f"{row.context:,} tokens at once; the deploy file asks for {asked.concurrency}")
    if row.max_context:
        message += f" (the longest context one request can have there is {row.max_context:,})"
    return [Finding.at("MEM016", message + "; `kvdoctor fit` gives the smallest layout that serves it", where,
                       evidence={"gpu_memory_bytes": row.gpu_memory_bytes, "kv_bytes": row.kv_bytes,
                                 "max_concurrency": row.max_concurrency, "max_context": row.max_context,
                                 "weights_bytes_per_rank": row.weights.bytes_per_rank,
                                 "terms": [t.to_json() for t in row.terms],
                                 "refusal": row.refusal.to_json() if row.refusal else None})]
