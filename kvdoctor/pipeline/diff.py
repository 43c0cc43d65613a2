"""One target of `kvdoctor diff`: the model planned and sized at the check's release and at the release it
upgrades to (`DIFF_TO` in the options), compared by the upgrade rule (checks/upgrade.py), which turns each
difference into a finding. The result is a `Result` like a check's, so every report format, baseline and
`--fail-on` gate works on it."""
from __future__ import annotations

from typing import Any

from kvdoctor.checks.context import Context
from kvdoctor.checks.upgrade import UPGRADE, Side, Upgrade, run
from kvdoctor.engines import check_profile
from kvdoctor.engines.base import EngineProfile
from kvdoctor.errors import InputError
from kvdoctor.load.loader import load_model
from kvdoctor.model import SEVERITIES, ModelSpec, Result
from kvdoctor.pipeline.check import Options, layer_rows
from kvdoctor.progress import update as progress

DIFF_TO = "diff_to"  # Options.extra key: the kvdoctor.engines.releases.Release upgraded to


def diff_target(target: str, opts: Options) -> Result:
    release_to = opts.extra[DIFF_TO]
    try:
        name = target.rstrip("/").rpartition("/")[2] or target
        progress(f"{name}: reading config and checkpoint headers")
        spec = load_model(target, library_check=not opts.static)
        profile = check_profile(opts.engine)
        before_deploy = opts.deploy
        after_deploy = opts.deploy.with_release(opts.engine, release_to)
        before = _side(profile, spec, before_deploy.settings(opts.engine), opts)
        after = _side(profile, spec, after_deploy.settings(opts.engine), opts)
        upgrade = Upgrade(engine=opts.engine, before=before, after=after)
        ctx = Context(spec=spec, engine=opts.engine, deploy=after_deploy, plan=after.plan,
                      observations={UPGRADE: upgrade}, options=opts.extra)
        findings = [opts.catalog.complete(f, opts.severity_overrides)
                    for f in run(ctx) if opts.selection.enabled(f.code)]
    except InputError as exc:
        return Result(target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[],
                      findings=[], error=str(exc))
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), f.code))
    dist = release_to.dist
    compared = {"engine": opts.engine, "from": before.release, "to": after.release,
                "why_from": _why(opts.deploy.release(opts.engine)), "why_to": release_to.why,
                "budget_before": before.budget, "budget_after": after.budget}
    info: dict[str, Any] = {"family": spec.family, "num_hidden_layers": spec.num_hidden_layers, "diff": compared}
    return Result(target=target, model_type=spec.model_type, engine=opts.engine,
                  engine_versions={dist: f"{before.release} -> {after.release}"}, layers=layer_rows(spec, after.plan),
                  findings=findings, info=info)


def _side(profile: EngineProfile, spec: ModelSpec, settings: Any, opts: Options) -> Side:
    plan = profile.plan(spec, settings)
    release = next(iter(plan.versions.values()), "")
    if not profile.can_budget() or opts.budget is None:
        return Side(release, plan)
    try:
        facts = profile.budget_facts(spec)
        budgets, how = profile.budget(facts, spec.config, settings, opts.budget, False)
    except InputError:
        return Side(release, plan)  # the model cannot be priced (or is refused before sizing): the plan says so
    row = budgets[0].to_json()
    row["budget"] = how
    return Side(release, plan, row)


def _why(release: Any) -> str | None:
    return None if release is None else release.why
