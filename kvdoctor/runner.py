"""Many targets in one run: expand folders of models, check them in parallel, keep the input order.

Checks are CPU-bound (they build caches and run kernels), so they run in worker processes. Workers
are spawned, not forked, so each imports torch and mlx afresh and behaves the same on every platform;
the results are the same, in the same order, whatever the number of workers.
"""
from __future__ import annotations

import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Callable

from kvdoctor.check import Options, check_target
from kvdoctor.model import Result

SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
MAX_DEPTH = 6


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _model_dirs(folder: Path) -> list[Path]:
    """Model directories (those holding config.json) below `folder`, sorted; a model's own subfolders
    are not searched, nor are hidden folders."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        depth = len(Path(dirpath).relative_to(folder).parts)
        if "config.json" in filenames and depth > 0:
            found.append(Path(dirpath))
            dirnames.clear()
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS) \
            if depth < MAX_DEPTH else []
    return sorted(found)


def expand_targets(targets: list[str]) -> list[str]:
    """Each target as given, except: a config.json stands for its folder, and a folder that is not a
    model but holds model folders stands for those. Repeats are dropped, the order is kept."""
    out: list[str] = []
    seen: set[str] = set()
    for target in targets:
        path = Path(target)
        expanded = [target]
        if path.is_file() and path.name == "config.json":
            expanded = [str(path.parent)]
        elif path.is_dir() and not (path / "config.json").exists():
            expanded = [str(d) for d in _model_dirs(path)] or [target]
        for item in expanded:
            key = os.path.abspath(item) if Path(item).exists() else item
            if key not in seen:
                seen.add(key)
                out.append(item)
    return out


def check_one(target: str, opts: Options) -> tuple[Result, str | None]:
    """One target; an unexpected exception becomes that target's error (exit 2) with its traceback,
    so one bad model does not stop the others.

    The checkpoint's tensor table is dropped from the result (reports use the summary in `info`):
    a large MoE checkpoint lists ~100k tensors, which would cost seconds to send back from a worker.
    """
    try:
        result = check_target(target, opts)
        if result.spec is not None:
            result.spec = replace(result.spec, checkpoint=None)
        return result, None
    except Exception as exc:  # noqa: BLE001 - reported, never swallowed
        result = Result(target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[],
                        findings=[], error=f"internal error while checking: {type(exc).__name__}: {exc}")
        return result, traceback.format_exc()


def run_targets(work: list[tuple[str, Options]], jobs: int,
                on_done: Callable[[int, Result], None] | None = None) -> tuple[list[Result], list[str]]:
    """Check each (target, options) pair; returns the results in input order and any tracebacks."""
    outcomes: list[tuple[Result, str | None] | None] = [None] * len(work)
    workers = max(1, min(jobs, len(work)))
    if workers == 1:
        for i, (target, opts) in enumerate(work):
            outcomes[i] = check_one(target, opts)
            if on_done:
                on_done(i, outcomes[i][0])
    else:
        import multiprocessing

        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(check_one, target, opts): i for i, (target, opts) in enumerate(work)}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    outcomes[i] = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker died (out of memory, a crash in a kernel)
                    target, opts = work[i]
                    outcomes[i] = (Result(target=target, model_type=None, engine=opts.engine, engine_versions={},
                                          layers=[], findings=[],
                                          error=f"internal error: the worker checking it died ({type(exc).__name__}: {exc})"),
                                   None)
                if on_done:
                    on_done(i, outcomes[i][0])
    results = [o[0] for o in outcomes if o is not None]
    tracebacks = [o[1] for o in outcomes if o is not None and o[1]]
    return results, tracebacks


def run_with_progress(work: list[tuple[str, Options]], jobs: int,
                      show: bool = True) -> tuple[list[Result], list[str]]:
    """run_targets with a progress bar on stderr when `show`, stderr is a terminal and there is more than one target."""
    from rich.console import Console

    console = Console(stderr=True)
    if len(work) < 2 or not show or not console.is_terminal:
        return run_targets(work, jobs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as progress:
        task = progress.add_task("", total=len(work))
        return run_targets(work, jobs, on_done=lambda i, r: progress.update(task, advance=1, description=r.target))
