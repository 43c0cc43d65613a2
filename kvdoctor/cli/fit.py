"""`kvdoctor fit MODEL --engine E --gpu H100-80GB --gpus 8`: does it start, what it serves, how to launch it.

The application wires it with `app.command("fit")(fit_command)`; the work is `kvdoctor.pipeline.fit`'s,
the views `kvdoctor.report.fit`'s.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

from kvdoctor.cli.options import MODEL, OFFLINE
from kvdoctor.cli.types import engine_type, strict_type
from kvdoctor.errors import InputError


def _fit_engines() -> list[str]:
    from kvdoctor.engines import fit_engines

    return fit_engines()


def fit_command(
    target: str = MODEL,
    engine: str = typer.Option("vllm", "--engine", "-e", click_type=engine_type(_fit_engines),
                               help="The serving engine; ENGINE==RELEASE prices that release (e.g. vllm==0.31.0)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", click_type=strict_type("Name", metavar="GPU"),
                                      help="A GPU preset (kvdoctor/data/gpus.json), e.g. H100-80GB, H200, A100-40GB."),
    gpus: Optional[int] = typer.Option(None, "--gpus", click_type=strict_type("Tokens", int, metavar="N"),
                                       help="GPUs to lay the model out on (default: the deploy file's, else 1)."),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", click_type=strict_type("Size", metavar="SIZE"),
                                             help="The memory each GPU reports, e.g. 79.2GiB (overrides the preset's)."),
    context: Optional[int] = typer.Option(None, "--context", click_type=strict_type("Tokens", int),
                                          help="Context per request (default: the model's longest)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", click_type=strict_type("Tokens", int, metavar="N"),
                                              help="Requests at that context served at once (default 1)."),
    kv_cache_dtype: Optional[str] = typer.Option(None, "--kv-cache-dtype", click_type=strict_type("Name", metavar="DTYPE"),
                                                 help="The engine's KV cache dtype, e.g. fp8 (default: the model's)."),
    deploy: Optional[str] = typer.Option(None, "--deploy", click_type=strict_type("Name", metavar="PATH"),
                                         help="Deploy settings (YAML): the budget: section's gpu, gpus, context and "
                                              "concurrency, and the engine's own section."),
    output_format: str = typer.Option("rich", "--format", "--output-format", help="rich, json or html."),
    output_file: Optional[str] = typer.Option(None, "--output-file", "-o", click_type=strict_type("Name", metavar="PATH"),
                                              help="Write the report here, not to stdout."),
    offline: bool = OFFLINE,
) -> None:
    """Weights per rank, the memory the engine leaves for KV caches, the tokens, concurrency and longest
    context that fit, the engine's refusals, and the smallest layout with its launch command."""
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        if output_format not in ("rich", "json", "html"):
            raise InputError(f"--format {output_format!r}: expected rich, json or html")
        doc = _document(target, engine, gpu, gpus, gpu_memory, context, concurrency, kv_cache_dtype, deploy)
    except InputError as exc:
        typer.echo(f"kvdoctor: error: {exc}", err=True)
        raise typer.Exit(2) from None
    from kvdoctor.report import fit as report_fit

    if output_format == "rich" and output_file is None:
        report_fit.render(doc)
    else:
        text = json.dumps(doc, indent=2) + "\n" if output_format == "json" else report_fit.html(doc) \
            if output_format == "html" else report_fit.text(doc)
        if output_file is None:
            typer.echo(text, nl=False)
        else:
            Path(output_file).write_text(text, encoding="utf-8")
    # 1: no layout of the GPUs asked for serves the request (a CI gate fails), whatever the recommendation
    raise typer.Exit(0 if any(row["fits"] for row in doc["rows"]) else 1)


def _document(target: str, engine: str, gpu: str | None, gpus: int | None, gpu_memory: str | None,
              context: int | None, concurrency: int | None, kv_cache_dtype: str | None,
              deploy_path: str | None) -> dict[str, Any]:
    from kvdoctor.engines.deploy import load_deploy
    from kvdoctor.pipeline.fit import fit_from_options

    deploy = load_deploy(deploy_path)
    for warning in deploy.warnings:
        typer.echo(f"kvdoctor: warning: {warning}", err=True)
    return fit_from_options(target, engine, gpu, gpus, gpu_memory, context, concurrency, kv_cache_dtype, deploy)
