"""kvdoctor's Python API: what `kvdoctor check`, `budget` and `triage` do, called in-process.

Each function returns the records the reports render, not text: `check` the `kvdoctor.model.Result`
of each model (the entries of `--format json`), `budget` the budget document (`kvdoctor budget
--format json`, `kvdoctor.budget/1`), `triage` the triage report (`kvdoctor.pipeline.triage.Report`).
Bad input raises `kvdoctor.errors.InputError` with the one-line message the command line prints; a
model that cannot be read is a `Result` whose `error` says why, as in the reports. Nothing is printed.

`API_VERSION` names this contract: a change that breaks a caller (a parameter renamed or removed, a
return type changed) raises its major number; a new optional parameter raises the minor one.
docs/api.md describes it.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from kvdoctor.errors import InputError
from kvdoctor.model import Finding, Result

if TYPE_CHECKING:
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.pipeline.triage import Report as TriageReport

API_VERSION = "1.1"
__all__ = ["API_VERSION", "Finding", "InputError", "Result", "budget", "check", "fit", "report_schema", "triage"]

PathLike = str | os.PathLike[str]


def check(targets: PathLike | Sequence[PathLike], *, engine: str = "hf", deploy: PathLike | None = None,
          select: Sequence[str] = ("ALL",), ignore: Sequence[str] = (), static: bool = False,
          dry_run: bool = False, trust_remote_code: bool = False) -> list[Result]:
    """Check models as `kvdoctor check TARGETS` does: one `Result` per model, in order (a folder of model
    folders stands for its models, as on the command line). `select` and `ignore` take codes or
    prefixes; `static` skips the probes; `dry_run` runs the engine's own code where it can."""
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.checks.selection import Selection, validate_selectors
    from kvdoctor.engines import dry_run_engines, require_extras
    from kvdoctor.engines.releases import for_engine, parse_engine
    from kvdoctor.fleet.runner import expand_targets
    from kvdoctor.pipeline.check import Options, check_target

    names = [os.fspath(targets)] if isinstance(targets, (str, os.PathLike)) else [os.fspath(t) for t in targets]
    if not names or not all(names):
        raise InputError("no models to check: name model directories")
    catalog = builtin_catalog()
    unknown = validate_selectors([*select, *ignore], catalog.codes())
    if unknown:
        raise InputError(f"unknown rule selector(s): {', '.join(unknown)}")
    engine, asked = parse_engine(engine, "check", "engine")
    if dry_run and (static or engine not in dry_run_engines()):
        raise InputError(f"dry_run needs engine {' or '.join(dry_run_engines())} and cannot be combined with static")
    require_extras(engine, static, dry_run)
    opts = Options(catalog=catalog, engine=engine, deploy=for_engine(_deploy(deploy), engine, asked, "engine"),
                   static=static,
                   selection=Selection(select=tuple(select), ignore=tuple(ignore)),
                   extra={"dry_run": dry_run, "trust_remote_code": trust_remote_code})
    return [check_target(target, opts) for target in expand_targets(names)]


def budget(target: PathLike, *, engine: str = "all", mode: str = "default", kv_budget: str | None = None,
           gpu_memory: str | None = None, context: int | None = None,
           deploy: PathLike | None = None) -> dict[str, Any]:
    """One model's KV budget per engine and mode, the document `kvdoctor budget --format json` prints.
    `kv_budget` and `gpu_memory` are sizes such as "40GiB"; `context` a number of tokens."""
    from kvdoctor.load.loader import load_model
    from kvdoctor.pipeline.budget import budget_document, budget_inputs, engines_for

    engines_for(engine, mode)
    if context is not None and context <= 0:
        raise InputError(f"context {context}: expected a positive number of tokens")
    settings = _deploy(deploy)
    return budget_document(load_model(os.fspath(target)), settings,
                           budget_inputs(settings, kv_budget, gpu_memory, context), engine, mode)


def fit(target: PathLike, *, engine: str = "vllm", gpu: str | None = None, gpus: int | None = None,
        gpu_memory: str | None = None, context: int | None = None, concurrency: int | None = None,
        kv_cache_dtype: str | None = None, deploy: PathLike | None = None) -> dict[str, Any]:
    """Whether the model starts on `gpus` GPUs of kind `gpu` (a preset, e.g. "H100-80GB"; `gpu_memory`
    overrides its size), what it serves at `context` and `concurrency`, and the smallest layout that does:
    the document `kvdoctor fit --format json` prints (`kvdoctor.fit/1`)."""
    from kvdoctor.pipeline.fit import fit_from_options

    return fit_from_options(os.fspath(target), engine, gpu, gpus, gpu_memory, context, concurrency, kv_cache_dtype,
                            _deploy(deploy))


def triage(log: PathLike | Iterable[str]) -> TriageReport:
    """The known engine errors in a log: a path names a file, anything else is the log's lines (a list
    of strings, an open text file). `report.hits` lists each catalog entry found, with its lines."""
    from kvdoctor.catalog import builtin_catalog
    from kvdoctor.pipeline.triage import clean, triage_file, triage_report

    if isinstance(log, (str, os.PathLike)):
        if os.fspath(log) == "-":
            raise InputError("triage reads a file or lines, not standard input ('-')")
        return triage_file(os.fspath(log), builtin_catalog())
    lines = ((number, clean(piece)) for number, line in enumerate(log, 1) for piece in line.split("\r"))
    return triage_report(lines, builtin_catalog())


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the `--format json` document, as shipped in the package
    (kvdoctor/data/report.schema.json): `result_json(result)` of each `check` result is an entry of it."""
    import json

    from kvdoctor.resources import data_dir

    return json.loads((data_dir() / "report.schema.json").read_text(encoding="utf-8"))


def _deploy(path: PathLike | None) -> Deploy:
    """The deploy file's settings (the defaults without one); its warnings as Python warnings."""
    from kvdoctor.engines.deploy import load_deploy

    settings = load_deploy(None if path is None else str(Path(path)))
    for text in settings.warnings:
        warnings.warn(f"kvdoctor: {text}", UserWarning, stacklevel=3)
    return settings
