"""One check of one target: load -> plan -> rules -> findings with catalog facts attached."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from kvdoctor.catalog import Catalog
from kvdoctor.checks import CHECKS, Check
from kvdoctor.context import Context
from kvdoctor.engines import plan_for
from kvdoctor.errors import InputError
from kvdoctor.limits import ProbeOverBudget, probes_fit
from kvdoctor.loader import load_model
from kvdoctor.model import SEVERITIES, Finding, Result
from kvdoctor.nodeploy import NoDeployFile
from kvdoctor.selection import Selection


@dataclass
class Options:
    catalog: Catalog
    engine: str = "hf"
    selection: Selection = field(default_factory=Selection)
    deploy: Any = field(default_factory=NoDeployFile)  # a deploy.Deploy, or the defaults of none
    static: bool = False
    severity_overrides: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def finalize(finding: Finding, opts: Options) -> Finding:
    """Attach the catalog's name, severity and fixes to a finding a rule produced."""
    brief = opts.catalog.brief(finding.code)
    if brief is None:
        raise RuntimeError(f"rule emitted {finding.code}, which has no catalog entry")
    name, severity, fixes = brief
    finding.name = name
    finding.severity = opts.severity_overrides.get(finding.code) or finding.severity or severity
    if not finding.fixes:
        finding.fixes = fixes
    return finding


def layer_rows(ctx: Context) -> list[dict[str, Any]]:
    plans = {p.index: p for p in ctx.plan.layers}
    rows = []
    for layer in ctx.spec.layers:
        plan = plans.get(layer.index)
        row = {
            "index": layer.index, "kind": layer.kind, "window": layer.window,
            "engine_window": plan.engine_window if plan else None,
            "cache": plan.cache if plan else None,
            "heads": layer.n_heads, "kv_heads": layer.n_kv_heads, "head_dim": layer.head_dim,
            "dtype": layer.dtype,
        }
        if plan is not None and plan.state is not None:
            row["state"] = plan.state
        rows.append(row)
    return rows


def active_checks(opts: Options) -> list[Check]:
    """The checks these options run: for this engine, allowed by --static, with a selected code."""
    return [check for check in CHECKS
            if (check.engines is None or opts.engine in check.engines)
            and not (opts.static and not check.static)
            and any(opts.selection.enabled(code) for code in check.codes)]


def checked_codes(opts: Options) -> list[str]:
    """The codes a target is checked for under these options (JUnit lists each, passing or not)."""
    return [code for check in active_checks(opts) for code in check.codes if opts.selection.enabled(code)]


def _run_check(check: Check, ctx: Context, probes_allowed: bool) -> Iterator[Finding]:
    """A check's findings. Probes (non-static checks) run only when their smallest caches fit the
    budget (LIM001 says so otherwise), and a probe the budget refused ends in its LIM001 finding."""
    if not check.static and not probes_allowed:
        return
    try:
        yield from check.runner()(ctx)
    except ProbeOverBudget as over:
        yield over.finding()


def check_target(target: str, opts: Options) -> Result:
    try:
        spec = load_model(target, library_check=not opts.static)
        plan = plan_for(opts.engine, spec, opts.deploy)
        ctx = Context(spec=spec, engine=opts.engine, deploy=opts.deploy, plan=plan, options=opts.extra)
        findings: list[Finding] = []
        probes_allowed = probes_fit(spec)  # sized once per model, not once per probe
        for check in active_checks(opts):
            for finding in _run_check(check, ctx, probes_allowed):
                if opts.selection.enabled(finding.code):
                    findings.append(finalize(finding, opts))
    except InputError as exc:
        return Result(target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[],
                      findings=[], error=str(exc))
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), f.code, -1 if f.layer is None else f.layer))
    info = {"family": spec.family, "num_hidden_layers": spec.num_hidden_layers, "defaults": spec.defaults,
            "notes": spec.notes, "hf_id": spec.hf_id, "dtype": spec.dtype,
            "checkpoint": None if spec.checkpoint is None else {
                "files": len(spec.checkpoint.files), "tensors": len(spec.checkpoint.tensors),
                "bytes": spec.checkpoint.total_bytes}}
    info.update(plan.data.get("report", {}))
    return Result(target=target, model_type=spec.model_type, engine=plan.engine, engine_versions=plan.versions,
                  layers=layer_rows(ctx), findings=findings, spec=spec, info=info)
