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

from kvdoctor.cli.types import engine_type, strict_type
from kvdoctor.errors import InputError


def _fit_engines() -> list[str]:
    from kvdoctor.engines import fit_engines

    return fit_engines()


def fit_command(
    target: str = typer.Argument(..., click_type=strict_type("Name", metavar="TARGET"),
                                 help="A model directory or Hugging Face id (org/name[@revision]: the local "
                                      "cache, else the Hub's metadata)."),
    engine: str = typer.Option("vllm", "--engine", "-e", click_type=engine_type(_fit_engines),
                               help="The serving engine."),
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
    offline: bool = typer.Option(False, "--offline", help="Fetch nothing from a Hub (as HF_HUB_OFFLINE=1)."),
) -> None:
    """Weights per rank, the memory the engine leaves for KV caches, the tokens, concurrency and longest
    context that fit, the engine's refusals, and the smallest layout with its launch command."""
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        if output_format not in ("rich", "json", "html"):
            raise InputError(f"--format {output_format!r}: expected rich, json or html")
        doc = fit_from_options(target, engine, gpu, gpus, gpu_memory, context, concurrency, kv_cache_dtype, deploy)
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


def fit_from_options(target: str, engine: str, gpu: str | None, gpus: int | None, gpu_memory: str | None,
                     context: int | None, concurrency: int | None, kv_cache_dtype: str | None,
                     deploy_path: str | None) -> dict[str, Any]:
    """The fit document for the command line's options over the deploy file's (the API calls it too)."""
    from kvdoctor.engines import fit_engines
    from kvdoctor.engines.budget.fit import Request
    from kvdoctor.engines.budget.fit import gpu as gpu_preset
    from kvdoctor.engines.deploy import load_deploy
    from kvdoctor.load.loader import load_model
    from kvdoctor.pipeline.fit import fit_document

    if engine not in fit_engines():
        raise InputError(f"--engine {engine!r}: expected one of {', '.join(fit_engines())}")
    for name, value in (("--context", context), ("--concurrency", concurrency), ("--gpus", gpus)):
        if value is not None and value <= 0:
            raise InputError(f"{name} {value}: expected a positive number")
    deploy = load_deploy(deploy_path)
    for warning in deploy.warnings:
        typer.echo(f"kvdoctor: warning: {warning}", err=True)
    asked = deploy.budget
    section: dict[str, Any] = deploy.settings(engine).model_dump()
    memory = gpu_memory or (str(asked.gpu_memory) if asked and asked.gpu_memory is not None else None)
    chosen = gpu_preset(gpu or (asked.gpu if asked else None), memory)
    settings = {k: v for k, v in section.items() if v is not None}
    layout = layout_of(section)
    if layout is not None and gpus is None:
        settings["layout"] = layout
        gpus = int(layout["tp"]) * int(layout["pp"]) * int(layout["dp"])
    request = Request(context=context or (asked.context if asked else None) or section.get("max_model_len")
                      or section.get("context_length"),
                      concurrency=concurrency or (asked.concurrency if asked else None),
                      kv_cache_dtype=kv_cache_dtype or (section.get("kv_cache_dtype")
                                                        if section.get("kv_cache_dtype") not in (None, "auto") else None))
    return fit_document(load_model(target), engine, chosen, gpus or (asked.gpus if asked else None), request, settings)


def layout_of(section: dict[str, Any]) -> dict[str, Any] | None:
    """The parallel layout a deploy file's engine section fixes (vLLM's spellings), or None."""
    tp = section.get("tensor_parallel_size") or section.get("tp_size") or 1
    pp = section.get("pipeline_parallel_size") or 1
    dp = section.get("data_parallel_size") or 1
    if (tp, pp, dp) == (1, 1, 1) and not section.get("enable_expert_parallel"):
        return None
    return {"tp": int(tp), "pp": int(pp), "dp": int(dp), "expert_parallel": bool(section.get("enable_expert_parallel"))}
