"""The findings every engine's dry run gives, from its `DryRun` record: it did not run (ENG050), the
engine's Python could not run it (ENG065), its process ended before the engine's start-up did (ENG051),
the engine raised an error the plan did not
predict (the catalog code whose pattern matches it, through the matcher `triage` uses; ENG051 when
none does), and the static plan disagreed with the engine's own answer (the engine's own code). The
engines' rule modules (dryrun_vllm.py, dryrun_sglang.py) call it with what is theirs."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kvdoctor.catalog.matcher import code_for
from kvdoctor.checks.dryrun_child import environment_finding
from kvdoctor.model import Finding, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog
    from kvdoctor.engines.base import DryRun, Plan, Refusal

MAX_LISTED = 6


def findings(record: DryRun, spec: ModelSpec, catalog: Catalog, *, label: str, difference_code: str,
             predicted: Refusal | None = None, judge_error: bool = True, described: str | None = None) -> list[Finding]:
    """`label`: the engine as the text names it ("vLLM"); `predicted`: the refusal the plan foresaw (its
    rule reports it, so the dry run raising it adds nothing); `judge_error`: False where the engine's error
    says nothing about the deploy (SGLang sizing at kvdoctor's own default budget); `described`: the release the
    plan describes (ENG110 when the engine's Python runs another)."""
    where = spec.key_source("model_type")
    if not record.ran:
        return [Finding.at("ENG050", f"dry run skipped: {record.reason}; the static {label} checks still ran", where)]
    version = record.versions.get(record.engine, "?")
    environment = environment_finding(record, spec)  # the engine's Python, not the engine, stopped it
    if environment is not None and (record.error is None or code_for(catalog, record.engine, record.error.cls,
                                                                      record.error.message) is None):
        return [environment]
    if record.outcome in ("timeout", "crashed"):
        return [Finding.at("ENG051", f"dry run ({record.engine} {version}): the child {record.reason} before "
                           f"{label} finished start-up: {record.stderr_tail[-300:]}", where,
                           evidence={"seconds": record.seconds})]
    out: list[Finding] = []
    if described is not None and version.partition("+")[0] not in (described, "?"):
        out.append(Finding.at("ENG110", f"the dry run ran {label} {version} but the check describes {label} "
                              f"{described}: where the two differ (refusals, layout, the plan-vs-engine findings "
                              f"below), the dry run is {version}'s answer, not {described}'s", where,
                              evidence={"described": described, "ran": version, "python": record.python}))
    error = record.error
    if error is not None and judge_error:
        code = code_for(catalog, record.engine, error.cls, error.message) or "ENG051"
        # a bare assert has no text to match a pattern with: the plan foresaw it if class and text agree
        foreseen = predicted is not None and (predicted.code == code or (
            predicted.error_class, predicted.message) == (error.cls, error.message))
        if not foreseen:
            out.append(Finding.at(code, f"dry run ({record.engine} {version}): {label} refused to start during "
                                  f"{error.stage}: {error.cls}: {error.message} (raised in {error.frame})", where,
                                  engine_error={"class": error.cls, "message": error.message, "stage": "startup",
                                                "frame": error.frame},
                                  evidence={"stage": error.stage, **{k: record.extra[k] for k in (
                                      "cpu_only", "workarounds") if k in record.extra}}))
    differences = list(record.differences)
    if differences:
        listed = "; ".join(differences[:MAX_LISTED]) + (f"; ... ({len(differences)} in all)"
                                                        if len(differences) > MAX_LISTED else "")
        out.append(Finding.at(difference_code, f"the static {label} plan and {label} {version}'s own code disagree: "
                              f"{listed}", where, evidence={"differences": differences}))
    return out


def confirmed_refusal(record: DryRun, plan: Plan[object], catalog: Catalog) -> str | None:
    """The code of the refusal the plan predicted, when the engine's own code raised it: its catalog
    pattern matches the engine's text (the numbers may be the shrunk copy's), or class and text agree."""
    predicted, error = (plan.refusals[0] if plan.refusals else None), record.error
    if predicted is None or error is None or record.extra.get("harness_failed"):
        return None
    code = code_for(catalog, record.engine, error.cls, error.message)
    if code is None and (predicted.error_class, predicted.message) == (error.cls, error.message):
        code = predicted.code
    return predicted.code if code == predicted.code else None
