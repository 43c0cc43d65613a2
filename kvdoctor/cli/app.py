"""The typer application: `kvdoctor check | merge | config | triage | rules | explain | budget | fit`.

Each command only parses its options and hands over to a module; heavy imports (torch, mlx) happen
only inside the checks that need them. `cli.main` is the entry point.
"""
from __future__ import annotations

import json
import re
from typing import List, Optional

import typer
from typer._click import exceptions as click_exc  # typer 0.28 carries its own copy of click

from kvdoctor import __version__
from kvdoctor.cli import collector
from kvdoctor.cli.check import (RUN, CheckRequest, apply_baselines, check_format, emit, resolve_settings,
                                    run_catalog, run_check)
from kvdoctor.errors import InputError
from kvdoctor.report import FORMATS
from kvdoctor.cli.options import OFFLINE
from kvdoctor.cli.types import engine_type, strict_type


app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Check a model's KV-cache layout against a serving engine before deploy.")

# Options shared by `check` and `config`: both resolve the same settings.


def _check_engines() -> list[str]:
    from kvdoctor.engines import check_engines

    return check_engines()


ENGINE = typer.Option(None, "--engine", "-e", click_type=engine_type(_check_engines),
                      help="Engine profile (default: the deploy file's, the config file's, else hf).")
# An empty string is no path: it would name the working directory.
PATH = strict_type("Name", metavar="PATH")
DEPLOY = typer.Option(None, "--deploy", click_type=PATH, help="Deploy settings (YAML).")
SELECT = typer.Option(None, "--select", help="Codes or prefixes to run (default ALL); replaces the config "
                      "file's selection.")
EXTEND_SELECT = typer.Option(None, "--extend-select", help="Codes or prefixes to add.")
IGNORE = typer.Option(None, "--ignore", help="Codes or prefixes to skip.")
SEVERITY = typer.Option(None, "--severity", help="Override a rule's severity: CODE=error|warning|info (repeatable).")
FAIL_ON = typer.Option(None, "--fail-on", help="Lowest severity that fails: error, warning or info (default error).")
CONFIG = typer.Option(None, "--config", click_type=PATH, help="Read this kvdoctor.toml or pyproject.toml instead of "
                      "searching for one.")
ISOLATED = typer.Option(False, "--isolated", help="Ignore config files.")
# The report options `check` and `merge` share.
FORMAT = typer.Option("rich", "--format", "--output-format", help=f"One of: {', '.join(FORMATS)}.")
OUTPUT_FILE = typer.Option(None, "--output-file", "-o", help="Write --format here, not stdout.")
JSON_OUTPUT = typer.Option(None, "--json-output", help="Also write JSON to this file.")
SARIF_OUTPUT = typer.Option(None, "--sarif-output", help="Also write SARIF to this file.")
JUNIT_OUTPUT = typer.Option(None, "--junit-output", help="Also write JUnit XML to this file.")
GITLAB_OUTPUT = typer.Option(None, "--gitlab-output", help="Also write GitLab Code Quality JSON.")
HTML_OUTPUT = typer.Option(None, "--html-output", click_type=PATH, help="Also write the HTML report to this file.")


def _fail(message: str) -> None:
    typer.echo(f"kvdoctor: error: {message}", err=True)
    raise typer.Exit(2)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="Show tracebacks of internal errors."),
          catalog: Optional[List[str]] = typer.Option(None, "--catalog", click_type=PATH,
                                                      help="Also load catalog entries (CODE.yaml files) from this "
                                                      "directory (repeatable).")) -> None:
    """kvdoctor."""
    RUN["debug"] = debug
    RUN["catalog_dirs"] = tuple(catalog or ())
    if ctx.invoked_subcommand != "check":  # `check` turns the collector back on once its own modules load
        collector.resume()


@app.command()
def check(
    targets: Optional[List[str]] = typer.Argument(None, click_type=strict_type("Name", metavar="TARGET"),
                                                  help="Model directories, folders holding model directories, or "
                                                  "Hugging Face ids (org/name[@revision]: the local cache, "
                                                  "else the Hub's metadata); default: the config file's "
                                                  "`targets`."),
    engine: Optional[str] = ENGINE,
    deploy: Optional[str] = DEPLOY,
    output_format: str = FORMAT,
    output_file: Optional[str] = OUTPUT_FILE,
    json_output: Optional[str] = JSON_OUTPUT,
    sarif_output: Optional[str] = SARIF_OUTPUT,
    junit_output: Optional[str] = JUNIT_OUTPUT,
    gitlab_output: Optional[str] = GITLAB_OUTPUT,
    html_output: Optional[str] = HTML_OUTPUT,
    kv_budget: Optional[str] = typer.Option(None, "--kv-budget", click_type=strict_type("Size", metavar="SIZE"),
                                            help="KV memory per GPU, e.g. 40GiB: the HTML "
                                            "report shows the tokens that fit per engine and mode."),
    statistics: bool = typer.Option(False, "--statistics", help="Print counts per code instead of the findings."),
    select: Optional[List[str]] = SELECT,
    extend_select: Optional[List[str]] = EXTEND_SELECT,
    ignore: Optional[List[str]] = IGNORE,
    severity: Optional[List[str]] = SEVERITY,
    fail_on: Optional[str] = FAIL_ON,
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings (never hides exit 2)."),
    static: bool = typer.Option(False, "--static", help="Config and checkpoint rules only: build no caches."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Also run the installed engine's own code on a "
                                 "weightless, shrunk copy of the model (sglang, sglang-mlx, vllm)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Let the dry run execute the "
                                           "model's own code (auto_map, model_file), in a child process."),
    dry_run_timeout: Optional[float] = typer.Option(None, "--dry-run-timeout",
                                                    click_type=strict_type("Seconds", float),
                                                    help="Kill a dry run after this many seconds (default 300)."),
    engine_python: Optional[str] = typer.Option(None, "--engine-python", click_type=PATH,
                                                help="The Python with the engine installed that --dry-run "
                                                "starts (vllm, sglang; default $KVDOCTOR_VLLM_PYTHON or "
                                                "$KVDOCTOR_SGLANG_PYTHON, else the venv `kvdoctor engines "
                                                "install ENGINE` builds)."),
    dry_run_budget: Optional[float] = typer.Option(None, "--dry-run-budget",
                                                   click_type=strict_type("Seconds", float),
                                                   help="Estimated seconds a dry-run schedule may take (default 45)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", click_type=PATH,
                                           help="Report only findings this baseline lacks."),
    write_baseline: Optional[str] = typer.Option(None, "--write-baseline", click_type=PATH,
                                                 help="Record today's findings here (exits 0 unless a target could "
                                                 "not be checked)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", click_type=strict_type("Jobs", int),
                                       help="Targets checked at once (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    offline: bool = OFFLINE,
    shard: Optional[str] = typer.Option(None, "--shard", help="K/N: check only shard K of N (by a hash of each "
                                        "target's identity; join the JSON of all shards with `kvdoctor merge`)."),
    executor: str = typer.Option("local", "--executor", help="local (worker processes) or ray (Ray tasks)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (default: "
                                              "RAY_ADDRESS, else a local Ray started for the run)."),
    config: Optional[str] = CONFIG,
    isolated: bool = ISOLATED,
) -> None:
    """Check models and report findings."""
    raise typer.Exit(run_check(CheckRequest(**locals())))


@app.command()
def diff(
    targets: Optional[List[str]] = typer.Argument(None, click_type=strict_type("Name", metavar="TARGET"),
                                                  help="Model directories, folders of them, or Hugging Face ids."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="The release running now, e.g. vllm==0.30.0 "
                                         "(default: the installed one, else kvdoctor's default)."),
    to: str = typer.Option(..., "--to", help="The release to upgrade to, e.g. vllm==0.33.0."),
    deploy: Optional[str] = DEPLOY,
    kv_budget: Optional[str] = typer.Option(None, "--kv-budget", click_type=strict_type("Size", metavar="SIZE"),
                                            help="KV memory per GPU the capacity is compared at (default: the deploy "
                                            "file's budget, else 40GiB)."),
    output_format: str = FORMAT,
    output_file: Optional[str] = OUTPUT_FILE,
    json_output: Optional[str] = JSON_OUTPUT,
    sarif_output: Optional[str] = SARIF_OUTPUT,
    junit_output: Optional[str] = JUNIT_OUTPUT,
    select: Optional[List[str]] = SELECT,
    ignore: Optional[List[str]] = IGNORE,
    severity: Optional[List[str]] = SEVERITY,
    fail_on: Optional[str] = FAIL_ON,
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings (never hides exit 2)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", click_type=strict_type("Jobs", int),
                                       help="Targets compared at once (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    offline: bool = OFFLINE,
    shard: Optional[str] = typer.Option(None, "--shard", help="K/N: compare only shard K of N."),
    executor: str = typer.Option("local", "--executor", help="local (worker processes) or ray (Ray tasks)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join."),
    config: Optional[str] = CONFIG,
    isolated: bool = ISOLATED,
) -> None:
    """What upgrading the engine changes for each model: refusals gained or lost, the KV layout, and the
    capacity at the budget (UPG findings; --fail-on gates on them)."""
    options = {k: v for k, v in locals().items() if k != "to"}
    raise typer.Exit(run_check(CheckRequest(static=True, **options), to=to))


@app.command()
def merge(
    parts: List[str] = typer.Argument(..., click_type=PATH, help="JSON reports of `check --shard K/N` runs."),
    output_format: str = FORMAT,
    output_file: Optional[str] = OUTPUT_FILE,
    json_output: Optional[str] = JSON_OUTPUT,
    sarif_output: Optional[str] = SARIF_OUTPUT,
    junit_output: Optional[str] = JUNIT_OUTPUT,
    gitlab_output: Optional[str] = GITLAB_OUTPUT,
    html_output: Optional[str] = HTML_OUTPUT,
    statistics: bool = typer.Option(False, "--statistics", help="Print counts per code instead of the findings."),
    fail_on: Optional[str] = FAIL_ON,
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings (never hides exit 2)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", click_type=PATH,
                                           help="Report only findings this baseline lacks."),
    config: Optional[str] = CONFIG,
    isolated: bool = ISOLATED,
) -> None:
    """Join the JSON reports of sharded checks into one result, in any output format, with check's exit code."""
    from kvdoctor.fleet.merge import merge_parts
    from kvdoctor.report import Report, exit_code

    check_format(output_format)
    rules = run_catalog()
    settings = resolve_settings(rules, None, None, None, None, None, None, fail_on, config, isolated)
    results, checked, deploy_path = merge_parts(parts)
    report = Report(results, rules, settings.root, settings.fail_on, deploy_path=deploy_path, checked=checked)
    apply_baselines(report, baseline, None)
    emit(report, output_format, output_file, statistics,
          {"json": json_output, "sarif": sarif_output, "junit": junit_output, "gitlab": gitlab_output,
           "html": html_output})
    for r in results:
        if r.error:
            typer.echo(f"kvdoctor: error: {r.error}", err=True)
    raise typer.Exit(exit_code(results, settings.fail_on, exit_zero))


@app.command("config")
def config_cmd(
    engine: Optional[str] = ENGINE,
    deploy: Optional[str] = DEPLOY,
    select: Optional[List[str]] = SELECT,
    extend_select: Optional[List[str]] = EXTEND_SELECT,
    ignore: Optional[List[str]] = IGNORE,
    severity: Optional[List[str]] = SEVERITY,
    fail_on: Optional[str] = FAIL_ON,
    config: Optional[str] = CONFIG,
    isolated: bool = ISOLATED,
    output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json"),
) -> None:
    """Show the settings in force (config file and command line merged) and where each came from."""
    settings = resolve_settings(run_catalog(), engine, deploy, select, extend_select, ignore, severity, fail_on,
                                config, isolated)
    rows = settings.shown()
    if output_format == "json":
        typer.echo(json.dumps({name: {"value": value, "from": origin} for name, value, origin in rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="kvdoctor settings")
    for col in ("setting", "value", "from"):
        table.add_column(col, overflow="fold")
    for name, value, origin in rows:
        shown = "-" if value is None else (value if isinstance(value, str) else json.dumps(value))
        table.add_row(name, Text(shown), Text(origin))
    Console().print(table)


@app.command()
def triage(
    log: str = typer.Argument(..., click_type=PATH, help="A server log or traceback file, or - for standard input."),
    output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json"),
) -> None:
    """Name the known errors in a log or traceback, with their meaning and fixes. Exit 1 if any is found."""
    from kvdoctor.pipeline.triage import triage_file

    report = triage_file(log, run_catalog())
    if output_format == "json":
        typer.echo(json.dumps(report.to_json(log), indent=2))
    else:
        from kvdoctor.report.explain import render_triage

        render_triage(report, "standard input" if log == "-" else log)
    raise typer.Exit(1 if report.hits else 0)


@app.command("rules")
def rules_cmd(output_format: str = typer.Option("rich", "--format", "--output-format",
                                               help="rich, json or markdown"),
              verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show engines, version "
                                           "ranges, the check and the codes that prevent each error.")) -> None:
    """List the catalog of known errors."""
    from kvdoctor.report.explain import rules_json, rules_markdown, rules_text

    rules = run_catalog()
    if output_format == "json":
        typer.echo(json.dumps(rules_json(rules), indent=2))
    elif output_format == "markdown":
        typer.echo(rules_markdown(rules))
    elif output_format == "rich":
        from rich.console import Console

        typer.echo(rules_text(rules, verbose=verbose, width=min(Console().width, 100)))
    else:
        _fail(f"unknown --format {output_format!r} for rules (rich, json or markdown)")


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code, e.g. SWA001."),
            output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json")) -> None:
    """Explain one catalog entry: meaning, triggers, fixes with examples, references."""

    entry = run_catalog().get(code.upper())
    if entry is None:
        _fail(f"no catalog entry {code!r} (see `kvdoctor rules`)")
    if output_format == "json":
        typer.echo(json.dumps(entry.model_dump(by_alias=True), indent=2))
        return
    from kvdoctor.report.explain import render_entry

    render_entry(entry)


from kvdoctor.cli.budget import budget_command  # noqa: E402  (light: typer only)
from kvdoctor.cli.fit import fit_command  # noqa: E402  (light: typer only)

app.command("budget")(budget_command)
app.command("fit")(fit_command)

from kvdoctor.cli.engines import engines_app  # noqa: E402  (light: typer only)

app.add_typer(engines_app, name="engines")


def run(args: list[str]) -> int:
    """Run one command line through typer: its exit code; a usage error is an InputError."""
    try:
        code = app(args, prog_name="kvdoctor", standalone_mode=False)  # one name for help and completion
    except click_exc.ClickException as exc:  # a usage error: one line, exit 2, whichever command raised it
        raise InputError(usage_error(exc)) from None
    except typer.Abort:
        return 130
    return code if isinstance(code, int) else 0


def usage_error(exc: click_exc.ClickException) -> str:
    """click's usage error as one line, in place of typer's boxed usage, hint and message."""
    ctx = getattr(exc, "ctx", None)
    commands = ctx.command.list_commands(ctx) if ctx is not None and hasattr(ctx.command, "list_commands") else []
    if isinstance(exc, click_exc.NoSuchOption):
        hint = f" (did you mean {' or '.join(sorted(exc.possibilities))}?)" if exc.possibilities else ""
        return f"no such option: {exc.option_name}{hint}"
    if isinstance(exc, click_exc.NoArgsIsHelpError) and commands:
        return f"missing command; expected one of: {', '.join(commands)} (see kvdoctor --help)"
    if isinstance(exc, click_exc.MissingParameter) and exc.param is not None:
        return f"missing {exc.param.param_type_name} {_param_name(exc.param)}"
    if isinstance(exc, click_exc.BadParameter) and exc.param is not None:
        return f"{_param_name(exc.param)} {' '.join(exc.message.split())}"
    unknown = re.match(r"No such command '(.*?)'\.", exc.message)
    if unknown and commands:
        import difflib

        near = difflib.get_close_matches(unknown.group(1), commands, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        return f"no such command: {unknown.group(1)!r}{hint}; expected one of: {', '.join(commands)}"
    text = " ".join(exc.format_message().split()).rstrip(".")
    return text[:1].lower() + text[1:]


def _param_name(param) -> str:
    """`--jobs` for an option (its longest spelling), `TARGETS` for an argument."""
    if param.param_type_name == "option":
        return max(param.opts, key=len)
    return (param.name or "argument").upper()
