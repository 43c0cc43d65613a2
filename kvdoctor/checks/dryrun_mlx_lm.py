"""What mlx-lm's own generation paths said in a dry run (kvdoctor.engines.mlx_lm.dryrun), as findings: the
findings every dry run gives (kvdoctor.checks.dryrun_engine), with MLX131 where the caches mlx-lm built
differ from the plan's."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.catalog import builtin_catalog
from kvdoctor.checks import DRY_RUN, Rule, dryrun_engine
from kvdoctor.checks.context import Context
from kvdoctor.engines.base import DryRun
from kvdoctor.model import Finding

RULE = Rule(codes=("ENG050", "ENG051", "ENG065", "MLX131"), engines=("mlx-lm",), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    record = ctx.observations.get(DRY_RUN)
    if not isinstance(record, DryRun):
        return []
    predicted = next((r for r in ctx.plan.refusals if not r.latent), None)
    return dryrun_engine.findings(record, ctx.spec, ctx.options.get("catalog") or builtin_catalog(),
                                  label="mlx-lm", difference_code="MLX131", predicted=predicted)
