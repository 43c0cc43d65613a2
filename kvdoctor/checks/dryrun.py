"""ENG050-ENG062: what the engine dry run (`--dry-run`) saw, held against the plan. The run itself is
a stage of the pipeline (the profile's `dry_run()`, in a child process); this rule only reads it."""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from kvdoctor.checks import DRY_RUN, Rule
from kvdoctor.checks.context import Context
from kvdoctor.engines import dry_run_engines, is_check_engine, profile
from kvdoctor.model import Finding

CHILD_CODES = ("ENG050", "ENG051", "ENG052", "ENG053", "ENG054", "ENG055", "ENG056", "ENG057", "ENG058", "ENG059",
               "ENG060", "ENG061", "ENG062")
VLLM_CODES = ("ENG050", "ENG051", "VLM030")  # a vLLM refusal the plan missed is reported under its own code
SGLANG_CODES = ("ENG050", "ENG051", "SGL050", "SGL051")  # likewise for SGLang on CUDA
OWN_CODES = {"vllm": VLLM_CODES, "sglang": SGLANG_CODES}  # profiles whose dry run is read by their own module


class _DryRunCodes(Mapping[str, tuple[str, ...]]):
    """The codes of each profile with a dry run (engines.dry_run_engines()), importing only the profile
    asked about: a check of one engine imports no other profile (nor pydantic with them)."""

    def __getitem__(self, engine: str) -> tuple[str, ...]:
        if not (is_check_engine(engine) and profile(engine).dry_run() is not None):
            raise KeyError(engine)
        return OWN_CODES.get(engine, CHILD_CODES)

    def __iter__(self) -> Iterator[str]:
        return iter(dry_run_engines())

    def __len__(self) -> int:
        return len(dry_run_engines())


RULE = Rule(codes=(*CHILD_CODES, "VLM030", "SGL050", "SGL051"), needs=(DRY_RUN,), by_engine=_DryRunCodes())


def run(ctx: Context) -> Iterable[Finding]:
    if ctx.engine == "vllm":
        return _vllm(ctx)
    if ctx.engine == "sglang":
        return _sglang(ctx)
    from kvdoctor.checks.dryrun_findings import Interpreter
    from kvdoctor.engines.sglang_mlx.dryrun.run import ChildOutcome

    outcome = ctx.observations.get(DRY_RUN)
    if not isinstance(outcome, ChildOutcome):
        return []
    findings, _ = Interpreter(outcome, ctx.spec, ctx.plan, ctx.options.get("catalog"), _foreseen(ctx)).interpret()
    return findings


def _foreseen(ctx: Context) -> frozenset[tuple[str, str, str]]:
    """The errors the mask-routing probe saw the backend's attention wrapper cause (ENG012's)."""
    from kvdoctor.engines.sglang_mlx.profile import MaskRouting, MaskRoutingProbe

    seen = ctx.observations.get(MaskRoutingProbe.name)
    if not isinstance(seen, MaskRouting) or seen.report is None:
        return frozenset()
    return frozenset((p.detail["class"], p.detail["message"], p.stage) for p in seen.report.problems
                     if p.kind == "wrapper_breaks_layer")


def _vllm(ctx: Context) -> list[Finding]:
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.checks import dryrun_vllm

    result = ctx.observations.get(DRY_RUN)
    if not isinstance(result, dict):
        return []
    if result.get("unavailable"):
        return [dryrun_vllm.unavailable(ctx.spec, result.get("why"))]
    return dryrun_vllm.findings(ctx.spec, ctx.plan, result, ctx.options.get("catalog") or builtin_catalog())


def _sglang(ctx: Context) -> list[Finding]:
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.checks import dryrun_sglang

    result = ctx.observations.get(DRY_RUN)
    if not isinstance(result, dict):
        return []
    if result.get("unavailable"):
        return [dryrun_sglang.unavailable(ctx.spec)]
    return dryrun_sglang.findings(ctx.spec, ctx.plan, result, ctx.options.get("catalog") or builtin_catalog(),
                                  ctx.deploy)
