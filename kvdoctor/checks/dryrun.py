"""ENG050-ENG060: what the engine dry run (`--dry-run`) saw, held against the plan. The run itself is
a stage of the pipeline (the profile's `dry_run()`, in a child process); this rule only reads it."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import DRY_RUN, Rule
from kvdoctor.context import Context
from kvdoctor.engines import dry_run_engines
from kvdoctor.model import Finding

CHILD_CODES = ("ENG050", "ENG051", "ENG052", "ENG053", "ENG054", "ENG055", "ENG056", "ENG057", "ENG058", "ENG059",
               "ENG060", "ENG061")
VLLM_CODES = ("ENG050", "ENG051", "VLM030")  # a vLLM refusal the plan missed is reported under its own code
RULE = Rule(codes=(*CHILD_CODES, "VLM030"), needs=(DRY_RUN,),
            by_engine={engine: VLLM_CODES if engine == "vllm" else CHILD_CODES for engine in dry_run_engines()})


def run(ctx: Context) -> Iterable[Finding]:
    if ctx.engine == "vllm":
        return _vllm(ctx)
    from kvdoctor.checks.dryrun_findings import Interpreter
    from kvdoctor.dryrun.run import ChildOutcome

    outcome = ctx.observations.get(DRY_RUN)
    if not isinstance(outcome, ChildOutcome):
        return []
    findings, _ = Interpreter(outcome, ctx.spec, ctx.plan, ctx.options.get("catalog")).interpret()
    return findings


def _vllm(ctx: Context) -> list[Finding]:
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.engines.vllm import dryrun

    result = ctx.observations.get(DRY_RUN)
    if not isinstance(result, dict):
        return []
    if result.get("unavailable"):
        return [dryrun.unavailable(ctx.spec)]
    return dryrun.findings(ctx.spec, ctx.plan, result, ctx.options.get("catalog") or builtin_catalog())
