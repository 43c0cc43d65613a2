"""What vLLM's own start-up said in a dry run (kvdoctor.engines.vllm.dryrun), as findings: the findings
every dry run gives (kvdoctor.checks.dryrun_engine), with VLM030 where the static plan and vLLM disagree."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from kvdoctor.catalog import builtin_catalog
from kvdoctor.checks import DRY_RUN, Rule, dryrun_engine
from kvdoctor.checks.context import Context
from kvdoctor.engines.base import DryRun
from kvdoctor.model import Finding, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog
    from kvdoctor.engines.base import Plan


RULE = Rule(codes=("ENG050", "ENG051", "ENG065", "ENG110", "VLM030"), engines=("vllm",), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    record = ctx.observations.get(DRY_RUN)
    if not isinstance(record, DryRun):
        return []
    return findings(ctx.spec, ctx.plan, record, ctx.options.get("catalog") or builtin_catalog())


def findings(spec: ModelSpec, plan: Plan[Any], record: DryRun, catalog: Catalog) -> list[Finding]:
    return dryrun_engine.findings(record, spec, catalog, label="vLLM", difference_code="VLM030",
                                  predicted=plan.refusals[0] if plan.refusals else None,
                                  described=plan.versions.get("vllm"))
