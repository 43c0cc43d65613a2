"""What `kvdoctor check` does once its options are read, and the pieces other commands share.

typer reads the command line (app.py) and hands a `CheckRequest` to `run_check`, which a test or a
benchmark may also build directly. Errors of the request are InputErrors: one line and exit 2, as the
entry point prints them.
"""
from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import msgspec

from kvdoctor.cli import collector
from kvdoctor.errors import InputError
from kvdoctor.report import FORMATS

if TYPE_CHECKING:
    from kvdoctor.pipeline.check import Options
    from kvdoctor.model import Result

# Options given before the command (`kvdoctor --debug --catalog DIR check ...`) hold for the whole run.
RUN: dict = {"debug": False, "catalog_dirs": ()}


class CheckRequest(msgspec.Struct):
    """The options of `kvdoctor check`, named as its parameters; the defaults are the command line's
    (tests/test_cli_basics.py holds them to typer's)."""

    targets: Optional[list[str]] = None
    engine: Optional[str] = None
    deploy: Optional[str] = None
    output_format: str = "rich"
    output_file: Optional[str] = None
    json_output: Optional[str] = None
    sarif_output: Optional[str] = None
    junit_output: Optional[str] = None
    gitlab_output: Optional[str] = None
    html_output: Optional[str] = None
    kv_budget: Optional[str] = None
    statistics: bool = False
    select: Optional[list[str]] = None
    extend_select: Optional[list[str]] = None
    ignore: Optional[list[str]] = None
    severity: Optional[list[str]] = None
    fail_on: Optional[str] = None
    exit_zero: bool = False
    static: bool = False
    dry_run: bool = False
    trust_remote_code: bool = False
    dry_run_timeout: Optional[float] = None
    engine_python: Optional[str] = None
    dry_run_budget: Optional[float] = None
    baseline: Optional[str] = None
    write_baseline: Optional[str] = None
    jobs: Optional[int] = None
    quiet: bool = False
    offline: bool = False
    shard: Optional[str] = None
    executor: str = "local"
    ray_address: Optional[str] = None
    config: Optional[str] = None
    isolated: bool = False


def echo(text: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def run_catalog():
    """The built-in catalog, plus the user's directories given with --catalog."""
    from kvdoctor.catalog import builtin_catalog, load_catalog

    if not RUN["catalog_dirs"]:
        return builtin_catalog()
    return load_catalog(extra_dirs=tuple(Path(d) for d in RUN["catalog_dirs"]))


def _split(values: Optional[list[str]], option: str) -> tuple[str, ...]:
    out: list[str] = []
    for value in values or []:
        codes = [v.strip().upper() for v in value.split(",") if v.strip()]
        if not codes:  # `--select ""` would otherwise select nothing and pass silently
            raise InputError(f"{option} {value!r}: expected rule codes or prefixes such as CFG or SWA001")
        out.extend(codes)
    return tuple(out)


def _severities(values: Optional[list[str]]) -> dict[str, str]:
    out = {}
    for value in values or []:
        code, sep, level = value.partition("=")
        if not sep or not code.strip():
            raise InputError(f"--severity {value!r}: expected CODE=error|warning|info")
        out[code.strip().upper()] = level.strip().lower()
    return out


def resolve_settings(rules, engine, deploy, select, extend_select, ignore, severity, fail_on, config, isolated,
                     engine_python=None):
    """The settings in force: the command line's options over the config file's, their codes those of
    the catalog `rules`."""
    from kvdoctor.cli.settings import CommandLine, resolve

    cli = CommandLine(select=_split(select, "--select") if select else None,
                      extend_select=_split(extend_select, "--extend-select"), ignore=_split(ignore, "--ignore"),
                      severity=_severities(severity), engine=engine, deploy=deploy,
                      fail_on=fail_on, config=config, isolated=isolated, engine_python=engine_python)
    settings = resolve(cli, rules.codes())
    for warning in settings.deploy.warnings:
        echo(f"kvdoctor: warning: {warning}", err=True)
    return settings


def check_format(output_format: str) -> None:
    if output_format not in FORMATS:
        raise InputError(f"--format {output_format!r}: expected one of {', '.join(FORMATS)}")


DIFF_BUDGET = "40GiB"  # `kvdoctor diff` compares tokens and requests at this KV budget unless one is given


def run_check(req: CheckRequest, to: str | None = None) -> int:
    """Check the request's models and report; the exit code. With `to` (`vllm==0.33.0`), `kvdoctor diff`:
    each model at the request's release and at `to`, compared (kvdoctor.pipeline.diff)."""
    from kvdoctor.pipeline.check import Options, checked_codes
    from kvdoctor.report.fingerprint import model_identity
    from kvdoctor.report import Report, exit_code
    from kvdoctor.fleet.runner import available_cores, expand_targets, in_shard, run_with_progress

    collector.resume()  # the check's modules are loaded
    check_format(req.output_format)
    if req.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by the loader, the workers and huggingface_hub alike
    part = _shard(req.shard)
    if req.executor not in ("local", "ray"):
        raise InputError(f"--executor {req.executor!r}: expected local or ray")
    if req.ray_address is not None and req.executor != "ray":
        raise InputError("--ray-address needs --executor ray")
    rules = run_catalog()
    settings = resolve_settings(rules, req.engine, req.deploy, req.select, req.extend_select, req.ignore, req.severity,
                                req.fail_on, req.config, req.isolated, req.engine_python)
    targets = list(req.targets or settings.targets)
    if not targets:
        raise InputError("no models to check: name model directories, or list them under `targets` in kvdoctor.toml")
    if req.dry_run:
        from kvdoctor.engines import dry_run_engines

        runnable = dry_run_engines()
        if req.static or settings.engine not in runnable:
            raise InputError(f"--dry-run needs --engine {' or '.join(runnable)} and cannot be combined with --static")
    from kvdoctor.engines import require_extras

    require_extras(settings.engine, req.static, req.dry_run)
    extra = {"dry_run": req.dry_run, "trust_remote_code": req.trust_remote_code,
             "dry_run_timeout": req.dry_run_timeout, "dry_run_budget": req.dry_run_budget,
             "engine_python": req.engine_python}
    budget = _budget_inputs(req, settings.deploy)
    if to is not None:
        from kvdoctor.pipeline.budget import budget_inputs
        from kvdoctor.pipeline.diff import DIFF_TO

        extra[DIFF_TO] = _release_to(settings.engine, to, req.engine_python)
        budget = budget_inputs(settings.deploy, kv_budget=req.kv_budget)
        if budget.kv_budget is None and budget.gpu_memory is None:
            budget = budget_inputs(settings.deploy, kv_budget=DIFF_BUDGET)
    chosen = expand_targets(targets)
    if part is not None:
        chosen = [target for target in chosen if in_shard(model_identity(target, settings.root), part)]
    work = [(target, Options(catalog=rules, engine=settings.engine, deploy=settings.deploy, static=req.static,
                             selection=_selection(settings, target), severity_overrides=settings.severity,
                             extra=extra, budget=budget))
            for target in chosen]
    from kvdoctor import progress

    show = progress.wanted(req.quiet, req.output_format in ("rich", "html"))
    console = rich_console(req.output_file) if req.output_format == "rich" and not req.statistics else None
    rendered: dict[str, list[str]] = {}
    if req.executor == "ray":
        from kvdoctor.fleet.ray_executor import run_on_ray

        results, tracebacks = run_on_ray(work, req.ray_address)
    else:
        renderers = _part_renderers(req, settings.root, console, fleet=len(work) > 1)
        with progress.shown(show and len(work) == 1):  # many targets: the runner's bar
            results, tracebacks, parts = run_with_progress(work, req.jobs or available_cores(), show=show,
                                                           render=partial(_parts, renderers) if renderers else None)
        rendered = {fmt: [part[fmt] for part in parts] for fmt in renderers} if parts is not None else {}
    # The targets differ only in their selection (per-model ignores): each selection's codes are listed once.
    by_selection = {opts.selection: opts for _, opts in work}
    codes = {selection: checked_codes(opts) for selection, opts in by_selection.items()}
    report = Report(results, rules, settings.root, settings.fail_on, deploy_path=settings.deploy.path,
                    checked=[codes[opts.selection] for _, opts in work],
                    json_parts=rendered.get("json"), rich_parts=rendered.get("rich"))
    apply_baselines(report, req.baseline, req.write_baseline)
    emit(report, req.output_format, req.output_file, req.statistics,
         {"json": req.json_output, "sarif": req.sarif_output, "junit": req.junit_output,
          "gitlab": req.gitlab_output, "html": req.html_output}, console)
    for text in tracebacks:
        echo(text, err=True)
    for r in results:
        if r.error:
            echo(f"kvdoctor: error: {r.error}", err=True)
    return exit_code(results, settings.fail_on, req.exit_zero or req.write_baseline is not None)


def _release_to(engine: str, to: str, engine_python: str | None) -> Any:
    """The release `--to` names: of the engine the check describes."""
    from kvdoctor.engines import profile_class
    from kvdoctor.engines.releases import choose, parse_engine

    name, version = parse_engine(to, "check", "--to")
    if name != engine:
        raise InputError(f"--to {to!r}: compare two releases of one engine, here {engine} (e.g. --to {engine}==X)")
    dist = profile_class(engine).release_dist
    if dist is None:
        raise InputError(f"--to {to!r}: kvdoctor describes one release of {engine} only")
    return choose(dist, version, "--to", engine_python)


def _budget_inputs(req: CheckRequest, deploy: Any) -> Any:
    """What the HTML report sizes each model's KV budget for: the deploy file's `budget:` section under
    --kv-budget, as `kvdoctor budget` reads them; None when there is no HTML report or no memory to size."""
    if not (req.html_output or req.output_format == "html"):
        return None
    from kvdoctor.pipeline.budget import budget_inputs

    inputs = budget_inputs(deploy, kv_budget=req.kv_budget)
    return inputs if inputs.kv_budget is not None or inputs.gpu_memory is not None else None


def _part_renderers(req: CheckRequest, root: Path, console,
                    fleet: bool = False) -> dict[str, Callable[[Result, Options], str]]:
    """What each worker renders of its own results, by format: the entries of the JSON report and, where
    the workers are forked from this process and so share its console, the terminal report's panels.
    Nothing where a baseline will change the results after the check."""
    from kvdoctor.fleet.runner import FORKS

    if req.baseline is not None:
        return {}
    renderers: dict[str, Callable[[Result, Options], str]] = {}
    if req.json_output is not None or (req.output_format == "json" and not req.statistics):
        renderers["json"] = partial(json_part, root)
    if console is not None and FORKS:
        from rich.panel import Panel

        from kvdoctor.report.rich_report import panel_text

        with console.capture():  # rich loads its emoji table at the first title: once, before the fork
            console.print(Panel("", title="kvdoctor"))
        renderers["rich"] = lambda result, opts: panel_text(console, result, fleet)
    return renderers


def json_part(root: Path, result: Result, opts: Options) -> str:
    from kvdoctor.pipeline.check import checked_codes
    from kvdoctor.report import result_part

    return result_part(root, result, checked_codes(opts))


def _parts(renderers: dict[str, Callable[[Result, Options], str]], result: Result, opts: Options) -> dict[str, str]:
    return {fmt: render(result, opts) for fmt, render in renderers.items()}


def rich_console(output_file: Optional[str]):
    """The terminal report's console: standard output's, or a plain 120 columns for --output-file
    (kept in memory, the file written once the report is complete)."""
    from rich.console import Console

    if not output_file:
        return Console()
    import io

    return Console(file=io.StringIO(), width=120, color_system=None)


def _selection(settings, target: str):
    """The target's selection: the per-model ignores matching its identity added, where there are any
    (the identity resolves its path: 30 us a target, for nothing when no pattern could match)."""
    from kvdoctor.report.fingerprint import model_identity

    if not settings.per_model_ignores:
        return settings.selection
    return settings.selection_for(model_identity(target, settings.root))


def _shard(value: Optional[str]) -> Optional[tuple[int, int]]:
    """--shard K/N as (K, N), 1 <= K <= N."""
    if value is None:
        return None
    k, sep, n = value.partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit() or not 1 <= int(k) <= int(n):
        raise InputError(f"--shard {value!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return int(k), int(n)


def apply_baselines(report, baseline: Optional[str], write_baseline: Optional[str]) -> None:
    """Read the old baseline first, record today's findings, then hide the known ones.

    A missing --baseline file is an error unless it is also the --write-baseline target (first run).
    Rewriting a baseline keeps its manual section; a file that is not a baseline is never overwritten.
    """
    if baseline is None and write_baseline is None:
        return
    from kvdoctor.report.baseline import apply_baseline, load_baseline
    from kvdoctor.report.baseline import write_baseline as write

    first_run = baseline is not None and baseline == write_baseline and not Path(baseline).exists()
    old = load_baseline(baseline) if baseline is not None and not first_run else None
    if write_baseline is not None:
        keep = load_baseline(write_baseline).manual if Path(write_baseline).exists() else []
        n = write(write_baseline, report.results, report.root, keep)
        echo(f"kvdoctor: recorded {n} finding(s) in baseline {write_baseline}", err=True)
    if old is not None:
        report.baseline = baseline
        report.suppressed = apply_baseline(report.results, old, report.root)
        report.json_parts = report.rich_parts = None  # rendered before the baseline hid findings


def emit(report, output_format: str, output_file: Optional[str], statistics: bool,
         extra: dict[str, Optional[str]], console=None) -> None:
    """The report in its format (stdout or --output-file), and in every extra format asked for; the
    terminal report on `console` when given (rich_console's)."""
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
        _rich(report, output_file, console or rich_console(output_file))
        return
    else:
        text = render(report, output_format)
    if output_file:
        _write(output_file, text)
    else:
        echo(text)


def _rich(report, output_file: Optional[str], console) -> None:
    from kvdoctor.report.rich_report import render

    render(report.results, console, report.rich_parts)
    if report.baseline is not None:
        console.print(f"{report.suppressed} finding(s) suppressed by baseline {report.baseline}", markup=False)
    if output_file:
        try:
            Path(output_file).write_text(console.file.getvalue(), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output_file}: cannot write: {exc.strerror or exc}") from None


def _append(path: str, text: str) -> None:
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise InputError(f"{path}: cannot write the job summary: {exc.strerror or exc}") from None


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
