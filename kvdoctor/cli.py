"""Command line: `kvdoctor check | rules | explain | triage | config`.

Input errors exit 2 with one line, never a traceback. Each command only parses its options and hands
over to a module; heavy imports (torch, mlx) happen only inside the checks that need them.
"""
from __future__ import annotations

import json
import os
import re
import sys
from functools import partial
from pathlib import Path
from typing import List, Optional

import typer
from typer._click import exceptions as click_exc  # typer 0.28 carries its own copy of click

from kvdoctor import __version__
from kvdoctor.errors import InputError
from kvdoctor.report import FORMATS
from kvdoctor.strict_cli import strict_type


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Check a model's KV-cache layout against a serving engine before deploy.")

# Options shared by `check` and `config`: both resolve the same settings.
ENGINE = typer.Option(None, "--engine", "-e", help="Engine profile (default: the deploy file's, the config "
                      "file's, else hf).")
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


# Options given before the command (`kvdoctor --debug --catalog DIR check ...`) hold for the whole run.
RUN = {"debug": False, "catalog_dirs": ()}


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="Show tracebacks of internal errors."),
          catalog: Optional[List[str]] = typer.Option(None, "--catalog", click_type=PATH,
                                                      help="Also load catalog entries (CODE.yaml files) from this "
                                                      "directory (repeatable).")) -> None:
    """kvdoctor."""
    RUN["debug"] = debug
    RUN["catalog_dirs"] = tuple(catalog or ())


def _catalog():
    """The built-in catalog, plus the user's directories given with --catalog."""
    from pathlib import Path

    from kvdoctor.catalog import builtin_catalog, load_catalog

    if not RUN["catalog_dirs"]:
        return builtin_catalog()
    return load_catalog(extra_dirs=tuple(Path(d) for d in RUN["catalog_dirs"]))


def _split(values: Optional[List[str]], option: str) -> tuple[str, ...]:
    out: list[str] = []
    for value in values or []:
        codes = [v.strip().upper() for v in value.split(",") if v.strip()]
        if not codes:  # `--select ""` would otherwise select nothing and pass silently
            _fail(f"{option} {value!r}: expected rule codes or prefixes such as CFG or SWA001")
        out.extend(codes)
    return tuple(out)


def _severities(values: Optional[List[str]]) -> dict[str, str]:
    out = {}
    for value in values or []:
        code, sep, level = value.partition("=")
        if not sep or not code.strip():
            _fail(f"--severity {value!r}: expected CODE=error|warning|info")
        out[code.strip().upper()] = level.strip().lower()
    return out


def _settings(engine, deploy, select, extend_select, ignore, severity, fail_on, config, isolated):
    from kvdoctor.settings import CommandLine, resolve

    cli = CommandLine(select=_split(select, "--select") if select else None,
                      extend_select=_split(extend_select, "--extend-select"), ignore=_split(ignore, "--ignore"),
                      severity=_severities(severity), engine=engine, deploy=deploy,
                      fail_on=fail_on, config=config, isolated=isolated)
    settings = resolve(cli, _catalog().codes())
    for warning in settings.deploy.warnings:
        typer.echo(f"kvdoctor: warning: {warning}", err=True)
    return settings


@app.command()
def check(
    targets: Optional[List[str]] = typer.Argument(None, click_type=strict_type("Name", metavar="TARGET"),
                                                  help="Model directories, folders holding model directories, or "
                                                  "Hugging Face ids (local cache only); default: the config "
                                                  "file's `targets`."),
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
                                                "$KVDOCTOR_SGLANG_PYTHON, else goldens/.venv/ENGINE)."),
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
    shard: Optional[str] = typer.Option(None, "--shard", help="K/N: check only shard K of N (by a hash of each "
                                        "target's identity; join the JSON of all shards with `kvdoctor merge`)."),
    executor: str = typer.Option("local", "--executor", help="local (worker processes) or ray (Ray tasks)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (default: "
                                              "RAY_ADDRESS, else a local Ray started for the run)."),
    config: Optional[str] = CONFIG,
    isolated: bool = ISOLATED,
) -> None:
    """Check models and report findings."""
    from kvdoctor.fingerprint import model_identity
    from kvdoctor.check import Options, checked_codes
    from kvdoctor.report import Report, exit_code, result_part
    from kvdoctor.runner import available_cores, expand_targets, in_shard, run_with_progress

    if output_format not in FORMATS:
        _fail(f"--format {output_format!r}: expected one of {', '.join(FORMATS)}")
    part = _shard(shard)
    if executor not in ("local", "ray"):
        _fail(f"--executor {executor!r}: expected local or ray")
    if ray_address is not None and executor != "ray":
        _fail("--ray-address needs --executor ray")
    settings = _settings(engine, deploy, select, extend_select, ignore, severity, fail_on, config, isolated)
    targets = list(targets or settings.targets)
    if not targets:
        _fail("no models to check: name model directories, or list them under `targets` in kvdoctor.toml")
    if dry_run:
        from kvdoctor.engines import dry_run_engines

        runnable = dry_run_engines()
        if static or settings.engine not in runnable:
            _fail(f"--dry-run needs --engine {' or '.join(runnable)} and cannot be combined with --static")
    from kvdoctor.extras import require_for_check

    require_for_check(settings.engine, static, dry_run)
    catalog = _catalog()
    extra = {"dry_run": dry_run, "trust_remote_code": trust_remote_code, "dry_run_timeout": dry_run_timeout,
             "dry_run_budget": dry_run_budget, "engine_python": engine_python}
    chosen = [(target, model_identity(target, settings.root)) for target in expand_targets(targets)]
    if part is not None:
        chosen = [(target, identity) for target, identity in chosen if in_shard(identity, part)]
    work = [(target, Options(catalog=catalog, engine=settings.engine, deploy=settings.deploy, static=static,
                             selection=settings.selection_for(identity),
                             severity_overrides=settings.severity, extra=extra))
            for target, identity in chosen]
    from kvdoctor import progress

    show = progress.wanted(quiet, output_format in ("rich", "html"))
    parts = None
    if executor == "ray":
        from kvdoctor.executors.ray_executor import run_on_ray

        results, tracebacks = run_on_ray(work, ray_address)
    else:
        # Each worker renders its results' part of the JSON report, unless a baseline will change them.
        wants_json = json_output is not None or (output_format == "json" and not statistics)
        render = partial(result_part, settings.root) if wants_json and baseline is None else None
        with progress.shown(show and len(work) == 1):  # many targets: the runner's bar
            results, tracebacks, parts = run_with_progress(work, jobs or available_cores(), show=show, render=render)
    # The targets differ only in their selection (per-model ignores): each selection's codes are listed once.
    by_selection = {opts.selection: opts for _, opts in work}
    codes = {selection: checked_codes(opts) for selection, opts in by_selection.items()}
    report = Report(results, catalog, settings.root, settings.fail_on, deploy_path=settings.deploy.path,
                    checked=[codes[opts.selection] for _, opts in work], kv_budget=kv_budget, json_parts=parts)
    _baselines(report, baseline, write_baseline)
    _emit(report, output_format, output_file, statistics,
          {"json": json_output, "sarif": sarif_output, "junit": junit_output, "gitlab": gitlab_output,
           "html": html_output})
    for text in tracebacks:
        typer.echo(text, err=True)
    for r in results:
        if r.error:
            typer.echo(f"kvdoctor: error: {r.error}", err=True)
    code = exit_code(results, settings.fail_on, exit_zero or write_baseline is not None)
    raise typer.Exit(code)


def _shard(value: Optional[str]) -> Optional[tuple[int, int]]:
    """--shard K/N as (K, N), 1 <= K <= N."""
    if value is None:
        return None
    k, sep, n = value.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit() or not 1 <= int(k) <= int(n):
        _fail(f"--shard {value!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return int(k), int(n)


def _baselines(report, baseline: Optional[str], write_baseline: Optional[str]) -> None:
    """Read the old baseline first, record today's findings, then hide the known ones.

    A missing --baseline file is an error unless it is also the --write-baseline target (first run).
    Rewriting a baseline keeps its manual section; a file that is not a baseline is never overwritten.
    """
    if baseline is None and write_baseline is None:
        return
    from kvdoctor.baseline import apply_baseline, load_baseline
    from kvdoctor.baseline import write_baseline as write

    first_run = baseline is not None and baseline == write_baseline and not Path(baseline).exists()
    old = load_baseline(baseline) if baseline is not None and not first_run else None
    if write_baseline is not None:
        keep = load_baseline(write_baseline).manual if Path(write_baseline).exists() else []
        n = write(write_baseline, report.results, report.root, keep)
        typer.echo(f"kvdoctor: recorded {n} finding(s) in baseline {write_baseline}", err=True)
    if old is not None:
        report.baseline = baseline
        report.suppressed = apply_baseline(report.results, old, report.root)
        report.json_parts = None  # rendered before the baseline hid findings


def _emit(report, output_format: str, output_file: Optional[str], statistics: bool,
          extra: dict[str, Optional[str]]) -> None:
    from kvdoctor.report import render

    for fmt, path in extra.items():
        if path:
            _write(path, render(report, fmt))
    if output_format == "github" and os.environ.get("GITHUB_STEP_SUMMARY"):
        from kvdoctor.report.github import job_summary

        _append(os.environ["GITHUB_STEP_SUMMARY"], job_summary(report))
    if statistics:
        from kvdoctor.report import statistics as stats

        text = stats.render_json(report.results) if output_format in ("json", "json-lines") \
            else stats.render_text(report.results)
    elif output_format == "rich":
        _rich(report, output_file)
        return
    else:
        text = render(report, output_format)
    if output_file:
        _write(output_file, text)
    else:
        typer.echo(text)


def _rich(report, output_file: Optional[str]) -> None:
    from rich.console import Console

    from kvdoctor.report.rich_report import render

    def show(console: Console) -> None:
        render(report.results, console)
        if report.baseline is not None:
            console.print(f"{report.suppressed} finding(s) suppressed by baseline {report.baseline}", markup=False)

    if not output_file:
        show(Console())
        return
    try:
        with open(output_file, "w", encoding="utf-8") as fh:
            show(Console(file=fh, width=120, color_system=None))
    except OSError as exc:
        _fail(f"{output_file}: cannot write: {exc.strerror or exc}")


def _append(path: str, text: str) -> None:
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        _fail(f"{path}: cannot write the job summary: {exc.strerror or exc}")


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        _fail(f"{path}: cannot write: {exc.strerror or exc}")


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
    from kvdoctor.merge import merge_parts
    from kvdoctor.report import Report, exit_code

    if output_format not in FORMATS:
        _fail(f"--format {output_format!r}: expected one of {', '.join(FORMATS)}")
    settings = _settings(None, None, None, None, None, None, fail_on, config, isolated)
    results, checked, deploy_path = merge_parts(parts)
    report = Report(results, _catalog(), settings.root, settings.fail_on, deploy_path=deploy_path, checked=checked)
    _baselines(report, baseline, None)
    _emit(report, output_format, output_file, statistics,
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
    settings = _settings(engine, deploy, select, extend_select, ignore, severity, fail_on, config, isolated)
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
    from kvdoctor.triage import triage_file

    report = triage_file(log, _catalog())
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

    catalog = _catalog()
    if output_format == "json":
        typer.echo(json.dumps(rules_json(catalog), indent=2))
    elif output_format == "markdown":
        typer.echo(rules_markdown(catalog))
    elif output_format == "rich":
        from rich.console import Console

        typer.echo(rules_text(catalog, verbose=verbose, width=min(Console().width, 100)))
    else:
        _fail(f"unknown --format {output_format!r} for rules (rich, json or markdown)")


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code, e.g. SWA001."),
            output_format: str = typer.Option("rich", "--format", "--output-format", help="rich or json")) -> None:
    """Explain one catalog entry: meaning, triggers, fixes with examples, references."""

    entry = _catalog().get(code.upper())
    if entry is None:
        _fail(f"no catalog entry {code!r} (see `kvdoctor rules`)")
    if output_format == "json":
        typer.echo(json.dumps(entry.model_dump(by_alias=True), indent=2))
        return
    from kvdoctor.report.explain import render_entry

    render_entry(entry)


from kvdoctor.budget.command import budget_command  # noqa: E402  (light: typer only)

app.command("budget")(budget_command)


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except click_exc.ClickException as exc:  # a usage error: one line, exit 2, whichever command raised it
        typer.echo(f"kvdoctor: error: {usage_error(exc)}", err=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except InputError as exc:
        typer.echo(f"kvdoctor: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except ModuleNotFoundError as exc:
        from kvdoctor.extras import extra_for_module

        extra = extra_for_module(exc.name)
        if extra is None or RUN["debug"]:
            raise
        typer.echo(f"kvdoctor: error: {exc.name} is not installed: pip install 'kvdoctor[{extra}]'", err=True)
        sys.exit(2)
    except Exception as exc:  # a bug in kvdoctor: one line unless --debug asks for the traceback
        if RUN["debug"]:
            raise
        typer.echo(f"kvdoctor: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                   err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


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
