"""What vLLM's own start-up said in a dry run (kvdoctor.engines.vllm.dryrun), as findings: an exception
under the catalog code whose vLLM pattern matches it (ENG051 when none does), VLM030 where the static
plan and the engine disagree, ENG050 when no vLLM Python ran it, ENG065 when that Python could not run it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from kvdoctor.catalog import builtin_catalog
from kvdoctor.catalog.matcher import code_for
from kvdoctor.checks import DRY_RUN, Rule
from kvdoctor.checks.context import Context
from kvdoctor.checks.dryrun_child import environment_finding
from kvdoctor.engines.pins import PINS
from kvdoctor.model import Finding, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog
    from kvdoctor.engines.base import Plan


RULE = Rule(codes=("ENG050", "ENG051", "ENG065", "VLM030"), engines=("vllm",), needs=(DRY_RUN,))


def run(ctx: Context) -> Iterable[Finding]:
    result = ctx.observations.get(DRY_RUN)
    if not isinstance(result, dict):
        return []
    if result.get("unavailable"):
        return [unavailable(ctx.spec, result.get("why"))]
    return findings(ctx.spec, ctx.plan, result, ctx.options.get("catalog") or builtin_catalog())


def findings(spec: ModelSpec, plan: Plan[Any], result: dict[str, Any], catalog: Catalog) -> list[Finding]:
    from kvdoctor.engines.vllm import dryrun

    versions = result.get("versions") or {}
    where = spec.key_source("model_type")
    outcome = result.get("outcome")
    environment = environment_finding("vllm", spec, result)
    if outcome is None and environment is not None:
        return [environment]
    if outcome is None:
        why = "timed out" if result.get("timed_out") else f"exited with {result.get('returncode')}"
        return [Finding.at("ENG051", f"dry run (vllm {versions.get('vllm', '?')}): the child {why} before vLLM "
                           f"finished: {result.get('stderr_tail', '')[-300:]}", where,
                           evidence={"seconds": result.get("seconds")})]
    out: list[Finding] = []
    if not outcome["start"] and environment is not None and code_for(catalog, "vllm", outcome["class"],
                                                                      outcome["message"]) is None:
        return [environment]
    if not outcome["start"]:
        code = code_for(catalog, "vllm", outcome["class"], outcome["message"]) or "ENG051"
        predicted = plan.refusals[0] if plan.refusals else None
        # a bare assert has no text to match a pattern with: the plan predicted it if class and text agree
        foreseen = predicted is not None and (predicted.code == code or (
            predicted.error_class, predicted.message) == (outcome["class"], outcome["message"]))
        if not foreseen:
            frame = outcome.get("raised_at_vllm") or outcome.get("raised_at")
            out.append(Finding.at(code, f"dry run (vllm {versions.get('vllm')}): vLLM refused to start during "
                                  f"{outcome['stage']}: {outcome['class']}: {outcome['message']} (raised in {frame})",
                                  where, engine_error={"class": outcome["class"], "message": outcome["message"],
                                                       "stage": "startup", "frame": frame},
                                  evidence={"cpu_only": outcome.get("cpu_only", False),
                                            "workarounds": result.get("workarounds", [])}))
    differences = dryrun.disagreements(plan, result)
    if differences:
        out.append(Finding.at("VLM030", f"the static vLLM plan and vLLM's own code disagree: {'; '.join(differences)}",
                              where, evidence={"differences": differences}))
    return out


def unavailable(spec: ModelSpec, why: str | None = None) -> Finding:
    from kvdoctor.engines.vllm import dryrun

    why = why or (f"no Python with vLLM {PINS['vllm']} found (run `kvdoctor engines install vllm`, or give "
                  f"--engine-python, or set {dryrun.ENV_PYTHON})")
    return Finding.at("ENG050", f"dry run skipped: {why}; the static vLLM checks still ran",
                      spec.key_source("model_type"))
