"""One model's KV budget per engine and mode, as the `budget` command and `check`'s reports show it.

`budget_inputs` merges the deploy file's `budget:` section with the command line; `budget_document`
sizes each engine the way its profile does and returns the JSON document (`kvdoctor.budget/1`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvdoctor.errors import InputError

if TYPE_CHECKING:
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.model import ModelSpec


def budget_inputs(deploy: Deploy, kv_budget: str | None = None, gpu_memory: str | None = None,
                  context: int | None = None) -> BudgetSettings:
    """The deploy file's `budget:` section with the command line's values over it."""
    from kvdoctor.engines.budget.settings import BudgetSettings, parse_size

    settings = (deploy.budget or BudgetSettings()).model_copy(deep=True)
    if kv_budget is not None:
        parse_size(kv_budget, "--kv-budget")
        settings.kv_budget, settings.gpu_memory = kv_budget, None
    if gpu_memory is not None:
        parse_size(gpu_memory, "--gpu-memory")
        settings.gpu_memory = gpu_memory
        if kv_budget is None:
            settings.kv_budget = None
    if context is not None:
        settings.context = context
    if settings.kv_budget is None and settings.gpu_memory is None and settings.gpu is not None:
        from kvdoctor.engines.budget.fit import gpu as gpu_preset  # a preset names the memory to estimate from

        settings.gpu_memory = str(gpu_preset(settings.gpu).memory_bytes)
    return settings


def engines_for(engine: str, mode: str) -> list[str]:
    """The engines `--engine` names (`all`: every engine with a budget model; `vllm==0.31.0`: vLLM at that
    release); InputError for an unknown engine or mode."""
    from kvdoctor.engines import budget_engines
    from kvdoctor.engines.releases import parse_engine

    name, _ = parse_engine(engine, "budget")
    if mode not in ("default", "all"):
        raise InputError(f"--mode {mode!r}: expected default or all")
    return budget_engines() if name == "all" else [name]


def at_releases(deploy: Deploy, engine: str, engines: list[str]) -> Deploy:
    """`deploy` with the release each engine is sized at chosen, as check chooses it: the one `--engine` names,
    else the deploy file's `engine_version`, else the installed or the default one. An engine whose release was
    chosen already (check's own, for its HTML report's budget) keeps it."""
    from kvdoctor.engines.releases import for_engine, parse_engine

    name, asked = parse_engine(engine, "budget")
    for each in engines:
        if deploy.release(each) is None:
            deploy = for_engine(deploy, each, asked if each == name else None, "--engine")
    return deploy


def budget_document(spec: ModelSpec, deploy: Deploy, settings: BudgetSettings, engine: str = "all",
                    mode: str = "default") -> dict[str, Any]:
    """The budget document (JSON shape) for one model; InputError for bad arguments."""
    engines = engines_for(engine, mode)
    deploy = at_releases(deploy, engine, engines)
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.checks.budget import deploy_sources, findings_for
    from kvdoctor.engines import profile
    from kvdoctor.engines.budget.facts import facts_from_spec
    from kvdoctor.engines.budget.run import document, plan_engine
    from kvdoctor.report import finding_json

    catalog = builtin_catalog()
    results, findings, not_priced, priced = {}, {}, {}, []
    for name in engines:
        try:  # each engine sizes the layers as it builds them; one that cannot price a kind says why
            facts = profile(name).budget_facts(spec)
            budgets, how = plan_engine(name, facts, spec.config, settings, deploy.settings(name),
                                       all_modes=mode == "all")
        except InputError as exc:
            if len(engines) == 1:
                raise
            not_priced[name] = str(exc)
            continue
        priced.append(facts)
        results[name] = (budgets, how)
        where = deploy_sources(deploy, name)
        findings[name] = [[finding_json(catalog.complete(f)) for f in findings_for(facts, b, where)] for b in budgets]
    if not results:
        raise InputError("; ".join(f"{name}: {why}" for name, why in not_priced.items()))
    try:
        summary = facts_from_spec(spec)  # the model's own layer kinds, as the config means them
    except InputError:
        summary = priced[0]
    doc = document(spec, summary, results, settings, findings, not_priced)
    chosen = {name: deploy.release(name) for name in results}
    doc["inputs"]["releases"] = {name: {"dist": r.dist, "version": r.version, "why": r.why}
                                 for name, r in chosen.items() if r is not None}
    return doc
