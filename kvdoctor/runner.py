"""Many targets in one run: expand folders of models, check them in parallel, keep the input order.

Checks are CPU-bound (they parse headers, build caches and run kernels), so with -j N they run in a
pool of N worker processes. Where the platform can fork (Linux), the workers are forked once the
parent has imported kvdoctor's checks, so a worker starts in milliseconds instead of importing
everything again; they are reused for every target (torch and mlx, which are not safe to fork, are
imported inside each worker on first use and then stay loaded). Elsewhere the workers are spawned.
The results are the same, in the same order, whatever the number of workers or the executor.
"""
from __future__ import annotations

import hashlib
import os
import sys
import traceback
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
    so one bad model does not stop the others."""
    try:
        return check_target(target, opts), None
    except Exception as exc:  # noqa: BLE001 - reported, never swallowed
        result = Result(target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[],
                        findings=[], error=f"internal error while checking: {type(exc).__name__}: {exc}")
        return result, traceback.format_exc()


def died(target: str, opts: Options, why: str) -> Result:
    """The result of a target whose worker died (out of memory, a crash in a kernel, a lost node)."""
    return Result(target=target, model_type=None, engine=opts.engine, engine_versions={}, layers=[], findings=[],
                  error=f"internal error: the worker checking it died ({why})")


def in_shard(identity: str, shard: tuple[int, int]) -> bool:
    """Whether a target belongs to shard K of N (1-based): decided by a hash of its identity alone,
    so adding or removing other targets never moves it to another shard."""
    k, n = shard
    digest = hashlib.sha256(identity.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n == k - 1


def warm_imports(work: list[tuple[str, Options]]) -> None:
    """Import, before forking, what every worker will need: the engine profiles of the run and every
    rule module (`all_checks()`; rule modules import nothing heavy at module level, and the probes
    that need torch or mlx import them inside each worker, as they must not be forked)."""
    from kvdoctor.checks import all_checks
    from kvdoctor.engines import check_profile

    for engine in sorted({opts.engine for _, opts in work}):
        check_profile(engine)
    all_checks()


Render = Callable[[Result, Options], str]
_WORK: list[tuple[str, Options]] = []
_RENDER: Render | None = None


def _keep_work(work: list[tuple[str, Options]], render: Render | None) -> None:
    global _WORK, _RENDER
    _WORK, _RENDER = work, render


def _check_range(start: int, stop: int) -> list[tuple[Result, str | None, str | None]]:
    return [_checked(*_WORK[i], _RENDER) for i in range(start, stop)]


def _checked(target: str, opts: Options, render: Render | None) -> tuple[Result, str | None, str | None]:
    """check_one, and the result rendered where it was made. A result that cannot be rendered gets
    no part: the parent then renders the whole report itself and meets the same error there."""
    result, text = check_one(target, opts)
    try:
        part = render(result, opts) if render else None
    except Exception:  # noqa: BLE001 - raised again by the parent's own rendering
        part = None
    return result, text, part


def chunk_size(targets: int, workers: int) -> int:
    """Targets per task: a few milliseconds of static check cost less than the pool's round trip, so
    small checks travel in batches; a batch stays small enough (eight per worker at least) that a
    slow model at the end does not leave the other workers idle."""
    return max(1, min(16, targets // (workers * 8)))


def _pool_context():
    import multiprocessing

    forkable = sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if forkable else "spawn")


def run_targets(work: list[tuple[str, Options]], jobs: int, on_done: Callable[[int, Result], None] | None = None,
                render: Render | None = None) -> tuple[list[Result], list[str], list[str] | None]:
    """Check each (target, options) pair; returns the results in input order, any tracebacks, and
    with `render` each result rendered by it in the process that checked it (None if any is missing)."""
    outcomes: list[tuple[Result, str | None, str | None] | None] = [None] * len(work)
    workers = max(1, min(jobs, len(work)))
    if workers == 1:
        for i, (target, opts) in enumerate(work):
            outcomes[i] = _checked(target, opts, render)
            if on_done:
                on_done(i, outcomes[i][0])
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = _pool_context()
        if context.get_start_method() == "fork":
            warm_imports(work)
            import gc

            gc.freeze()  # what the parent holds stays out of the workers' collections (no copy-on-write)
        # The work list reaches each worker once (inherited when forked), never once per target.
        size = chunk_size(len(work), workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_keep_work,
                                 initargs=(work, render)) as pool:
            futures = {pool.submit(_check_range, start, min(start + size, len(work))): start
                       for start in range(0, len(work), size)}
            for future in as_completed(futures):
                start = futures[future]
                indices = range(start, min(start + size, len(work)))
                try:
                    done = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker died (out of memory, a crash in a kernel)
                    done = [(died(*work[i], f"{type(exc).__name__}: {exc}"), None, None) for i in indices]
                for i, outcome in zip(indices, done):
                    outcomes[i] = outcome
                    if on_done:
                        on_done(i, outcome[0])
    results = [o[0] for o in outcomes if o is not None]
    tracebacks = [o[1] for o in outcomes if o is not None and o[1]]
    parts = [o[2] for o in outcomes if o is not None and o[2] is not None]
    return results, tracebacks, parts if render and len(parts) == len(results) else None


def run_with_progress(work: list[tuple[str, Options]], jobs: int, show: bool = True,
                      render: Render | None = None) -> tuple[list[Result], list[str], list[str] | None]:
    """run_targets with a progress bar on stderr when `show`, stderr is a terminal and there is more than one target."""
    if len(work) < 2 or not show or not sys.stderr.isatty():  # rich is imported only when the bar is shown
        return run_targets(work, jobs, render=render)
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        return run_targets(work, jobs, render=render)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as progress:
        task = progress.add_task("", total=len(work))
        return run_targets(work, jobs, on_done=lambda i, r: progress.update(task, advance=1, description=r.target),
                           render=render)
