"""`kvdoctor budget MODEL`: KV budget per engine and mode, side by side.

The application wires it with `app.command("budget")(budget_command)`; the work is
`kvdoctor.pipeline.budget`'s, the table `kvdoctor.report.budget`'s.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import typer

from kvdoctor.cli.options import MODEL, OFFLINE
from kvdoctor.cli.types import engine_type, strict_type
from kvdoctor.errors import InputError


def _budget_engines() -> list[str]:
    from kvdoctor.engines import budget_engines

    return [*budget_engines(), "all"]


def budget_command(
    target: str = MODEL,
    engine: str = typer.Option("all", "--engine", "-e", click_type=engine_type(_budget_engines),
                               help="An engine profile with a budget model, or all; ENGINE==RELEASE sizes that "
                                    "release (e.g. vllm==0.31.0)."),
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
    offline: bool = OFFLINE,
) -> None:
    """KV budget per engine and mode: bytes per token per layer kind, groups or pools, state, capacity."""
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        doc = _document(target, engine, mode, kv_budget, gpu_memory, context, deploy)
    except InputError as exc:
        typer.echo(f"kvdoctor: error: {exc}", err=True)
        raise typer.Exit(2) from None
    if output_format == "json":
        typer.echo(json.dumps(doc, indent=2))
    else:
        from kvdoctor.report.budget import render
        render(doc, verbose=verbose)


def _document(target: str, engine: str, mode: str, kv_budget: str | None, gpu_memory: str | None,
              context: int | None, deploy_path: str | None) -> dict[str, Any]:
    from kvdoctor.engines.deploy import load_deploy
    from kvdoctor.load.loader import load_model
    from kvdoctor.pipeline.budget import budget_document, budget_inputs, engines_for

    engines_for(engine, mode)  # a wrong --engine or --mode is reported before any file is read
    if context is not None and context <= 0:
        raise InputError(f"--context {context}: expected a positive number of tokens")
    deploy = load_deploy(deploy_path)
    for warning in deploy.warnings:
        typer.echo(f"kvdoctor: warning: {warning}", err=True)
    settings = budget_inputs(deploy, kv_budget, gpu_memory, context)
    return budget_document(load_model(target), deploy, settings, engine, mode)
