"""ENG050-ENG062: what sglang-mlx's dry run (`--dry-run`) saw, held against the plan. The run itself is
a stage of the pipeline (the profile's `dry_run()`, in a child process); this rule only reads it. The
vLLM and SGLang (CUDA) dry runs are read by dryrun_vllm.py and dryrun_sglang.py."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import DRY_RUN, Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding

CHILD_CODES = ("ENG050", "ENG051", "ENG052", "ENG053", "ENG054", "ENG055", "ENG056", "ENG057", "ENG058", "ENG059",
               "ENG060", "ENG061", "ENG062")

RULE = Rule(codes=CHILD_CODES, engines=("sglang-mlx",), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.checks.dryrun_findings import Interpreter
    from kvdoctor.engines.base import DryRun

    record = ctx.observations.get(DRY_RUN)
    if not isinstance(record, DryRun):
        return []
    findings, _ = Interpreter(record.observation, ctx.spec, ctx.plan, ctx.options.get("catalog"),
                              _foreseen(ctx)).interpret()
    return findings


def _foreseen(ctx: Context) -> frozenset[tuple[str, str, str]]:
    """The errors the mask-routing probe saw the backend's attention wrapper cause (ENG012's)."""
    from kvdoctor.engines.sglang_mlx.profile import MaskRouting, MaskRoutingProbe

    seen = ctx.observations.get(MaskRoutingProbe.name)
    if not isinstance(seen, MaskRouting) or seen.report is None:
        return frozenset()
    return frozenset((p.detail["class"], p.detail["message"], p.stage) for p in seen.report.problems
                     if p.kind == "wrapper_breaks_layer")
