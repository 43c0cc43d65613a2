"""One check of one target, a straight pipeline:

load -> profile.plan -> the probes the selected rules need (each sized before it builds; LIM001 for
the first past the budget) -> the dry run, when asked -> rules on a frozen (spec, plan, observations)
-> findings with catalog facts attached -> `info` from profile.report(plan, observations).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from kvdoctor.catalog import Catalog
from kvdoctor.checks import DRY_RUN, Check, all_checks
from kvdoctor.checks.cfg_semantics import guess_guard
from kvdoctor.checks.context import Context
from kvdoctor.checks.dryrun_engine import confirmed_refusal
from kvdoctor.engines import check_profile
from kvdoctor.engines.base import DryRun
from kvdoctor.errors import InputError
from kvdoctor.checks.lim import ProbeOverBudget, probes_fit
from kvdoctor.limits import PROBE_BUDGET_BYTES
from kvdoctor.load.loader import load_model
from kvdoctor.model import SEVERITIES, Finding, ModelSpec, Result
from kvdoctor.engines.nodeploy import NoDeployFile
from kvdoctor.progress import update as progress
from kvdoctor.checks.selection import Selection

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.engines.base import EngineProfile, Plan


class Options(msgspec.Struct):
    catalog: Catalog
    engine: str = "hf"
    selection: Selection = msgspec.field(default_factory=Selection)
    deploy: Any = msgspec.field(default_factory=NoDeployFile)  # a deploy.Deploy, or the defaults of none
    static: bool = False
    severity_overrides: dict[str, str] = msgspec.field(default_factory=dict)
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    budget: Any = None  # a BudgetSettings: also size the model's KV budget per engine (the HTML report shows it)


def layer_rows(spec: ModelSpec, plan: Plan[object]) -> list[dict[str, Any]]:
    plans = {p.index: p for p in plan.layers}
    rows = []
    for layer in spec.layers:
        lp = plans.get(layer.index)
        row: dict[str, Any] = {
            "index": layer.index, "kind": layer.kind, "window": layer.window,
            "engine_window": lp.engine_window if lp else None,
            "cache": lp.cache if lp else None,
            "heads": layer.n_heads, "kv_heads": layer.n_kv_heads, "head_dim": layer.head_dim,
            "dtype": layer.dtype,
        }
        if lp is not None:
            if lp.state is not None:
                row["state"] = lp.state
            # an engine field named like a model field (vLLM's KV `dtype`) keeps both, as `engine_<name>`
            row.update({k if k not in row else f"engine_{k}": v for k, v in lp.extra.items()})
        rows.append(row)
    return rows


def active_checks(opts: Options) -> list[Check]:
    """The checks these options run: for this engine, allowed by --static, with a selected code."""
    return [check for check in all_checks()
            if check.applies_to(opts.engine)
            and not (opts.static and not check.rule.static)
            and any(opts.selection.enabled(code) for code in check.rule.codes_for(opts.engine))]


def checked_codes(opts: Options) -> list[str]:
    """The codes a target is checked for under these options (JUnit lists each, passing or not)."""
    return [code for check in active_checks(opts) for code in check.rule.codes_for(opts.engine)
            if opts.selection.enabled(code)]


def run_probes(profile: EngineProfile, names: set[str], spec: ModelSpec, plan: Plan[object], deploy: Deploy,
               settings: BaseModel, label: str = "") -> tuple[dict[str, object], list[Finding]]:
    """Run the profile's probes that the rules need, each within the probe budget: a probe lists what it
    will build first; the first entry past the budget becomes LIM001 and the probe builds only what
    comes before it."""
    observations: dict[str, object] = {}
    over: list[Finding] = []
    for probe in profile.probes():
        if probe.name not in names:
            continue
        costs = list(probe.costs(spec, plan, settings))
        fits = next((i for i, cost in enumerate(costs) if cost.nbytes > PROBE_BUDGET_BYTES), len(costs))
        if fits < len(costs):
            cost = costs[fits]
            source = deploy.source(cost.setting) if cost.setting else cost.source
            over.append(ProbeOverBudget(cost.what, cost.nbytes, PROBE_BUDGET_BYTES, source, cost.layer).finding())
        progress(f"{label}: {probe.name} probe")
        observations[probe.name] = probe.run(spec, plan, settings, fits)
    return observations, over


def check_target(target: str, opts: Options) -> Result:
    try:
        name = target.rstrip("/").rpartition("/")[2] or target
        progress(f"{name}: reading config and checkpoint headers")
        spec = load_model(target, library_check=not opts.static)
        profile = check_profile(opts.engine)
        if not profile.answers_unread:
            spec.require_layers()
        settings = opts.deploy.settings(opts.engine)
        plan = profile.plan(spec, settings)
        checks = active_checks(opts)
        # Probes run only when their smallest caches fit the budget (sized once per model; LIM001 says so
        # otherwise), and so do the rules that need them.
        probes_allowed = probes_fit(spec)
        if not probes_allowed:
            checks = [check for check in checks if check.rule.static]
        wanted = {name for check in checks for name in check.rule.probes}
        observations, findings = run_probes(profile, wanted, spec, plan, opts.deploy, settings, name)
        runner = profile.dry_run()
        if opts.extra.get(DRY_RUN) and runner is not None and any(DRY_RUN in c.rule.needs for c in checks):
            progress(f"{name}: dry run of {plan.engine}'s own code (a child process)")
            observations[DRY_RUN] = runner.run(spec, settings, plan, opts.extra)
        ctx = Context(spec=spec, engine=opts.engine, deploy=opts.deploy, plan=plan, settings=settings,
                      observations=observations, options=opts.extra)
        for check in checks:
            progress(f"{name}: {check.module.rpartition('.')[2]} rules" + ("" if check.rule.static else " (probes)"))
            findings.extend(check.run(ctx))
        findings = [guess_guard(opts.catalog.complete(f, opts.severity_overrides), spec)
                    for f in findings if opts.selection.enabled(f.code)]
    except InputError as exc:
        return Result(target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[],
                      findings=[], error=str(exc))
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), f.code, -1 if f.layer is None else f.layer))
    info: dict[str, Any] = {
        "family": spec.family, "num_hidden_layers": spec.num_hidden_layers, "defaults": spec.defaults,
        "notes": spec.notes, "hf_id": spec.hf_id, "dtype": spec.dtype,
        "checkpoint": None if spec.checkpoint is None else {
            "files": len(spec.checkpoint.files), "tensors": len(spec.checkpoint.tensors),
            "bytes": spec.checkpoint.total_bytes}}
    info.update(profile.report(plan, observations))
    release = opts.deploy.release(opts.engine)
    if release is not None:
        info["release"] = {"dist": release.dist, "version": release.version, "why": release.why}
    dry = observations.get(DRY_RUN)
    if isinstance(dry, DryRun):  # every engine's dry run leaves the same record, in every format
        info["dry_run"] = dry.to_json()
        confirms = confirmed_refusal(dry, plan, opts.catalog) if dry.ran else None
        if dry.ran:
            info["dry_run"]["confirms_plan_refusal"] = confirms
        info.setdefault("engine_notes", []).append(dry.summary() + (f" (confirms {confirms})" if confirms else ""))
    budget, budget_error = _budget(spec, opts)
    return Result(target=target, model_type=spec.model_type, engine=plan.engine, engine_versions=dict(plan.versions),
                  layers=layer_rows(spec, plan), findings=findings, model_dir=spec.model_dir, info=info,
                  budget=budget, budget_error=budget_error, source=spec.origin or None)


def _budget(spec: ModelSpec, opts: Options) -> tuple[dict[str, Any] | None, str | None]:
    """The budget document `kvdoctor budget` gives for this model and deploy file, when asked for."""
    if opts.budget is None:
        return None, None
    from kvdoctor.pipeline.budget import budget_document

    try:
        return budget_document(spec, opts.deploy, opts.budget), None
    except InputError as exc:
        return None, str(exc)
