"""The SGLang pool probe's observations as findings: SGLang's own pool classes, built on the CPU device,
break a pool invariant (SGL007), or start up otherwise than the static plan predicts (SGL008). When no
SGLang Python is found the probe is skipped and says so in `info.sglang.pool_probe`."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding

RULE = Rule(codes=("SGL007", "SGL008"), engines=("sglang",), needs=("probe:sglang_pools",))
WHAT = {"reach": "a layer's canary did not land (only) in the buffer the plan gives it",
        "unplanned_or_missing": "a layer the plan gives a buffer wrote no canary",
        "aliasing": "two layers' accessors return the same buffer",
        "dense": "a pool's buffer indices are not 0..n-1"}


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.sglang.profile import PoolsRun

    seen = ctx.observations.get("sglang_pools")
    if not isinstance(seen, PoolsRun) or seen.skipped is not None:
        return
    where = ctx.spec.key_source("model_type")
    for name, breaches in seen.invariants.items():
        if breaches:
            yield Finding.at("SGL007", f"SGLang's own pools: {WHAT[name]}: {breaches}", where,
                             evidence={"invariant": name, "breaches": breaches})
    if seen.startup and not seen.startup.get("agree", True):
        engine, plan = seen.startup.get("engine"), seen.startup.get("plan")
        said = "starts" if engine is None else f"raises {engine[0]}: {engine[1]}"
        meant = "a start" if plan is None else f"{plan[0]}: {plan[1]}"
        error = None if engine is None else {"class": engine[0], "message": engine[1], "stage": "startup"}
        yield Finding.at("SGL008", f"SGLang's own start-up {said}, where kvdoctor's plan predicts {meant}", where,
                         engine_error=error, evidence={"engine": engine, "plan": plan})
