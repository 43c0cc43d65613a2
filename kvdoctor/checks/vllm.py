"""VLM020-VLM024: where vLLM silently does something other than what config.json means (windows it
drops or applies differently, HMA off reserving full length, a window applied to every layer, MTP
modules without a cache), and where the static profile does not model the layers at all (VLM024).
The logic is kvdoctor.checks.vllm_differences; this module only wires it."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding, Source

RULE = Rule(codes=("VLM020", "VLM021", "VLM022", "VLM023", "VLM024"), engines=("vllm",))


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.checks.vllm_differences import differences

    unmodeled = getattr(ctx.plan.facts, "unmodeled", None)
    if unmodeled:
        return [Finding.at("VLM024", f"no static vLLM layer plan: {unmodeled}; `--dry-run` runs vLLM's own "
                                     "model class instead", ctx.spec.key_source("architectures"))]
    return differences(ctx.spec, ctx.plan, hma_source(ctx))


def hma_source(ctx: Context) -> Source | None:
    """The deploy line that turned the hybrid manager off: the flag itself, else the EAGLE-style
    speculation vLLM turns it off for; None when neither is in the deploy file."""
    for setting in ("vllm.disable_hybrid_kv_cache_manager", "vllm.speculative_config"):
        source = ctx.deploy.source(setting)
        if source.kind == "deploy":
            return source
    return None
