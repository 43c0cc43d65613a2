"""Command line: `kvdoctor check | rules | explain`. Input errors exit 2 with one line, never a traceback."""
from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from kvdoctor import __version__
from kvdoctor.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Check a model's KV-cache layout against a serving engine before deploy.")

FORMATS = ("rich", "json")


def _fail(message: str) -> None:
    typer.echo(f"kvdoctor: error: {message}", err=True)
    raise typer.Exit(2)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """kvdoctor."""


def _split(values: Optional[List[str]]) -> tuple[str, ...]:
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip().upper() for v in value.split(",") if v.strip())
    return tuple(out)


@app.command()
def check(
    targets: List[str] = typer.Argument(..., help="Model directories or Hugging Face ids (local cache only)."),
    engine: str = typer.Option("hf", "--engine", "-e", help="Engine profile: hf (the model's own meaning)."),
    deploy: Optional[str] = typer.Option(None, "--deploy", help="Deploy settings (YAML)."),
    output_format: str = typer.Option("rich", "--format", "--output-format", help=f"One of: {', '.join(FORMATS)}."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Codes or prefixes to run (default ALL)."),
    extend_select: Optional[List[str]] = typer.Option(None, "--extend-select", help="Codes or prefixes to add."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Codes or prefixes to skip."),
    fail_on: str = typer.Option("error", "--fail-on", help="Lowest severity that fails: error, warning or info."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings (never hides exit 2)."),
    static: bool = typer.Option(False, "--static", help="Config and checkpoint rules only: build no caches."),
) -> None:
    """Check model directories and report findings."""
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.check import Options, check_target
    from kvdoctor.deploy import load_deploy
    from kvdoctor.report import document, exit_code
    from kvdoctor.selection import Selection, validate_selectors

    if output_format not in FORMATS:
        _fail(f"--format {output_format!r}: expected one of {', '.join(FORMATS)}")
    if fail_on not in ("error", "warning", "info"):
        _fail(f"--fail-on {fail_on!r}: expected error, warning or info")
    catalog = builtin_catalog()
    selection = Selection(select=_split(select) or ("ALL",), extend_select=_split(extend_select),
                          ignore=_split(ignore))
    unknown = validate_selectors(selection.select + selection.extend_select + selection.ignore, catalog.codes())
    if unknown:
        _fail(f"unknown rule selector(s): {', '.join(unknown)} (see `kvdoctor rules`)")
    settings = load_deploy(deploy)
    opts = Options(catalog=catalog, engine=settings.engine if engine == "hf" and settings.engine else engine,
                   selection=selection, deploy=settings, static=static)
    from kvdoctor.engines import ENGINES
    if opts.engine not in ENGINES:
        _fail(f"unknown engine {opts.engine!r}; expected one of: {', '.join(sorted(ENGINES))}")
    results = [check_target(t, opts) for t in targets]
    if output_format == "json":
        typer.echo(json.dumps(document(results), indent=2))
    else:
        from kvdoctor.report.rich_report import render
        render(results)
    for r in results:
        if r.error:
            typer.echo(f"kvdoctor: error: {r.error}", err=True)
    raise typer.Exit(exit_code(results, fail_on, exit_zero))


@app.command("rules")
def rules_cmd(output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json")) -> None:
    """List the catalog of known errors."""
    from kvdoctor.catalog import builtin_catalog

    catalog = builtin_catalog()
    if output_format == "json":
        typer.echo(json.dumps([e.model_dump(by_alias=True) for e in catalog.entries.values()], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvdoctor catalog ({len(catalog.entries)} entries)")
    for col in ("code", "name", "severity", "engines", "check", "summary"):
        table.add_column(col, overflow="fold")
    for code in catalog.codes():
        e = catalog[code]
        table.add_row(code, e.name, e.severity, ", ".join(f"{r.name} {r.versions}" for r in e.engines),
                      "yes" if e.implemented else "none yet", e.summary)
    Console().print(table)


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code, e.g. SWA001."),
            output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json")) -> None:
    """Explain one catalog entry: meaning, triggers, fixes with examples, references."""
    from kvdoctor.catalog import builtin_catalog

    entry = builtin_catalog().get(code.upper())
    if entry is None:
        _fail(f"no catalog entry {code!r} (see `kvdoctor rules`)")
    if output_format == "json":
        typer.echo(json.dumps(entry.model_dump(by_alias=True), indent=2))
        return
    from kvdoctor.report.explain import render_entry

    render_entry(entry)


def main() -> None:
    try:
        app()
    except InputError as exc:
        typer.echo(f"kvdoctor: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
