"""`kvdoctor budget MODEL`: KV budget per engine and mode, side by side.

The CLI wires it with `app.command("budget")(budget_command)`; heavy modules load inside.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import typer

from kvdoctor.errors import InputError
from kvdoctor.cli.types import strict_type


def budget_command(
    target: str = typer.Argument(..., click_type=strict_type("Name", metavar="TARGET"),
                                 help="A model directory or Hugging Face id (local cache only)."),
    engine: str = typer.Option("all", "--engine", "-e", help="An engine profile with a budget model (vllm, "
                                                            "sglang, mlx-lm) or all."),
    mode: str = typer.Option("default", "--mode", help="default (one mode per engine) or all (the knobs that "
                                                        "change the budget: HMA, fp8, SWA ratio, kv_bits, ...)."),
    kv_budget: Optional[str] = typer.Option(None, "--kv-budget", click_type=strict_type("Size", metavar="SIZE"),
                                            help="Memory left for KV caches after weights, e.g. 40GiB (the engines "
                                                 "profile it on the GPU)."),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", click_type=strict_type("Size", metavar="SIZE"),
                                             help="GPU size, e.g. 141GiB: the KV budget is estimated from checkpoint "
                                                  "weights."),
    context: Optional[int] = typer.Option(None, "--context", click_type=strict_type("Tokens", int),
                                          help="Context length (default: the model's maximum)."),
    deploy: Optional[str] = typer.Option(None, "--deploy", click_type=strict_type("Name", metavar="PATH"),
                                         help="Deploy settings (YAML) with a budget: section."),
    output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show groups, pools, state and capacity "
                                                                 "per engine and mode."),
) -> None:
    """KV budget per engine and mode: bytes per token per layer kind, groups or pools, state, capacity."""
    try:
        doc = build_document(target, engine, mode, kv_budget, gpu_memory, context, deploy)
    except InputError as exc:
        typer.echo(f"kvdoctor: error: {exc}", err=True)
        raise typer.Exit(2) from None
    if output_format == "json":
        typer.echo(json.dumps(doc, indent=2))
    else:
        from kvdoctor.report.budget import render
        render(doc, verbose=verbose)


def build_document(target: str, engine: str = "all", mode: str = "default", kv_budget: str | None = None,
                   gpu_memory: str | None = None, context: int | None = None,
                   deploy: str | None = None) -> dict[str, Any]:
    """The budget document (JSON shape) for one model; InputError for bad arguments."""
    from kvdoctor.engines import budget_engines

    choices = (*budget_engines(), "all")
    if engine not in choices:
        raise InputError(f"--engine {engine!r}: expected one of {', '.join(choices)}")
    if mode not in ("default", "all"):
        raise InputError(f"--mode {mode!r}: expected default or all")
    if context is not None and context <= 0:
        raise InputError(f"--context {context}: expected a positive number of tokens")
    from kvdoctor.engines.budget.facts import facts_from_spec
    from kvdoctor.engines.budget.run import document, plan_engine
    from kvdoctor.engines.budget.settings import BudgetSettings, parse_size
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.check import Options, finalize
    from kvdoctor.checks.budget import deploy_sources, findings_for
    from kvdoctor.engines.deploy import load_deploy
    from kvdoctor.engines import profile
    from kvdoctor.load.loader import load_model
    from kvdoctor.report import finding_json

    settings_file = load_deploy(deploy)
    for warning in settings_file.warnings:
        typer.echo(f"kvdoctor: warning: {warning}", err=True)
    settings = (settings_file.budget or BudgetSettings()).model_copy(deep=True)
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
    spec = load_model(target)
    engines = list(choices[:-1]) if engine == "all" else [engine]
    opts = Options(catalog=builtin_catalog())
    results, findings, not_priced, priced = {}, {}, {}, []
    for name in engines:
        try:  # each engine sizes the layers as it builds them; one that cannot price a kind says why
            facts = profile(name).budget_facts(spec)
        except InputError as exc:
            if len(engines) == 1:
                raise
            not_priced[name] = str(exc)
            continue
        priced.append(facts)
        budgets, how = plan_engine(name, facts, spec.config, settings, settings_file.settings(name),
                                   all_modes=mode == "all")
        results[name] = (budgets, how)
        where = deploy_sources(settings_file, name)
        findings[name] = [[finding_json(finalize(f, opts)) for f in findings_for(facts, b, where)] for b in budgets]
    if not results:
        raise InputError("; ".join(f"{name}: {why}" for name, why in not_priced.items()))
    try:
        summary = facts_from_spec(spec)  # the model's own layer kinds, as the config means them
    except InputError:
        summary = priced[0]
    return document(spec, summary, results, settings, findings, not_priced)
