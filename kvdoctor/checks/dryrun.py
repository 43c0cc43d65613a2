"""ENG050-ENG060: what the engine dry run (`--dry-run`) saw, held against the plan. The run itself is
a stage of the pipeline (the profile's `dry_run()`, in a child process); this rule only reads it."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import DRY_RUN, Rule
from kvdoctor.context import Context
from kvdoctor.engines import dry_run_engines
from kvdoctor.model import Finding

RULE = Rule(codes=("ENG050", "ENG051", "ENG052", "ENG053", "ENG054", "ENG055", "ENG056", "ENG057", "ENG058",
                   "ENG059", "ENG060", "ENG061"), engines=tuple(dry_run_engines()), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.checks.dryrun_findings import Interpreter
    from kvdoctor.dryrun.run import ChildOutcome

    outcome = ctx.observations.get(DRY_RUN)
    if not isinstance(outcome, ChildOutcome):
        return []
    findings, _ = Interpreter(outcome, ctx.spec, ctx.plan, ctx.options.get("catalog")).interpret()
    return findings
