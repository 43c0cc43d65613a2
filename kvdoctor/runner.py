"""Many targets in one run: expand folders of models, check them in parallel, keep the input order.

Checks are CPU-bound (they parse headers, build caches and run kernels), so with -j N they run in a
pool of N worker processes. Where the platform can fork (Linux), the workers are forked once the
parent has imported kvdoctor's checks, so a worker starts in milliseconds instead of importing
everything again; they are reused for every target (torch and mlx, which are not safe to fork, are
imported inside each worker on first use and then stay loaded). Checks that take a few milliseconds
and load neither (static ones, hf's) are done in this process until the rest is enough to repay the
pool, so a few targets are no slower at -j N than at -j 1. Elsewhere the workers are spawned. The
results are the same, in the same order, whatever the number of workers or the executor.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from kvdoctor.check import Options, check_target
from kvdoctor.model import Result

SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
MAX_DEPTH = 6


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _model_dirs(folder: str) -> list[str]:
    """Model directories (those holding config.json) below `folder`, in the order sorted Paths would
    have; a model's own subfolders are not searched, nor are hidden folders or symlinked ones (as
    os.walk would not follow them)."""
    found: list[str] = []

    def visit(path: str, depth: int) -> None:
        try:
            with os.scandir(path) as listing:
                entries = list(listing)
        except OSError:
            return
        if depth > 0 and any(e.name == "config.json" and not _is_dir(e) for e in entries):
            found.append(path)
            return
        if depth < MAX_DEPTH:
            for e in entries:
                if not e.name.startswith(".") and e.name not in SKIP_DIRS and not e.is_symlink() and _is_dir(e):
                    visit(e.path, depth + 1)

    visit(folder, 0)
    if folder == os.curdir:  # scandir spells "./m" what Path spells "m"
        found = [path[len(os.curdir + os.sep):] for path in found]
    return sorted(found, key=lambda path: os.path.normcase(path).split(os.sep))


def _is_dir(entry: os.DirEntry) -> bool:
    """As os.walk judges it: an entry that cannot be stat'ed (a symlink loop) is no folder."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def expand_targets(targets: list[str]) -> list[str]:
    """Each target as given, except: a config.json stands for its folder, and a folder that is not a
    model but holds model folders stands for those. Repeats are dropped, the order is kept."""
    out: list[str] = []
    seen: set[str] = set()
    for target in targets:
        expanded = [target]
        if os.path.isfile(target) and os.path.basename(target) == "config.json":
            expanded = [str(Path(target).parent)]
        elif os.path.isdir(target) and not os.path.exists(os.path.join(target, "config.json")):
            expanded = _model_dirs(str(Path(target))) or [target]
        for item in expanded:
            key = os.path.abspath(item) if os.path.exists(item) else item
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
        import traceback

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
    from kvdoctor.fingerprint import sha256

    k, n = shard
    digest = sha256(identity.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n == k - 1


def warm_imports(work: list[tuple[str, Options]]) -> None:
    """Import, before forking, what every worker will need: the engine profiles of the run, every
    rule module (`all_checks()`; rule modules import nothing heavy at module level, and the probes
    that need torch or mlx import them inside each worker, as they must not be forked) and the
    SHA-256 of the first finding's fingerprint. Unless every target is `--static`, also safetensors
    and numpy, with which each file's header is read a second time (checkpoint.read_header): 50 ms of
    imports a worker would pay again."""
    from kvdoctor.fingerprint import sha256

    sha256(b"")
    if not all(opts.static for _, opts in work):
        import numpy  # noqa: F401
        import safetensors  # noqa: F401

    from kvdoctor.checks import all_checks
    from kvdoctor.engines import check_profile

    for engine in sorted({opts.engine for _, opts in work}):
        check_profile(engine)
    all_checks()


Render = Callable[[Result, Options], Any]  # a result's part of a report: whatever the caller renders
Outcome = tuple[Result, Optional[str], Any]  # the result, its traceback, its part
_WORK: list[tuple[str, Options]] = []
_RENDER: Render | None = None


def _keep_work(work: list[tuple[str, Options]], render: Render | None) -> None:
    global _WORK, _RENDER
    _WORK, _RENDER = work, render


def _check_range(start: int, stop: int) -> list[Outcome]:
    return [_checked(*_WORK[i], _RENDER) for i in range(start, stop)]


def _checked(target: str, opts: Options, render: Render | None) -> Outcome:
    """check_one, and the result rendered where it was made. A result that cannot be rendered gets
    no part: the parent then renders the whole report itself and meets the same error there."""
    result, text = check_one(target, opts)
    try:
        part = render(result, opts) if render else None
    except Exception:  # noqa: BLE001 - raised again by the parent's own rendering
        part = None
    return result, text, part


def batches(targets: int, workers: int) -> list[range]:
    """The work list cut into tasks, in input order. A few milliseconds of static check cost less than
    a round trip to a worker, so small checks travel in batches, of at most 16 and eight a worker at
    least; towards the end they shrink to one target, so that no worker waits long for another's last."""
    most = max(1, min(16, targets // (workers * 8)))
    out: list[range] = []
    while (start := out[-1].stop if out else 0) < targets:
        out.append(range(start, start + max(1, min(most, (targets - start) // (workers * 2)))))
    return out


FORKS = sys.platform == "linux"  # elsewhere fork is unsafe (macOS) or missing (Windows): workers are spawned
_AT_EXIT: list[Callable[[], None]] = []


def at_worker_exit(close: Callable[[], None]) -> None:
    """Have this process call `close` when it ends as a forked -j worker: it leaves through os._exit,
    where atexit does not run (a worker's warm dry-run children are closed so)."""
    _AT_EXIT.append(close)

Done = Callable[[range, list[Outcome]], None]


def run_targets(work: list[tuple[str, Options]], jobs: int, on_done: Callable[[int, Result], None] | None = None,
                render: Render | None = None) -> tuple[list[Result], list[str], list[Any] | None]:
    """Check each (target, options) pair; returns the results in input order, any tracebacks, and
    with `render` each result rendered by it in the process that checked it (None if any is missing)."""
    outcomes: list[Outcome | None] = [None] * len(work)

    def done(indices: range, batch: list[Outcome]) -> None:
        for i, outcome in zip(indices, batch):
            outcomes[i] = outcome
            if on_done:
                on_done(i, outcome[0])

    workers = max(1, min(jobs, len(work)))
    start = 0
    if workers > 1 and FORKS and all(_keeps_this_process_forkable(opts) for _, opts in work):
        start = _here_until_a_pool_pays(work, workers, render, done)
        workers = min(workers, len(work) - start)
    if workers <= 1:
        for i in range(start, len(work)):
            done(range(i, i + 1), [_checked(*work[i], render)])
    elif FORKS:
        _forked(work, workers, render, done, start)
    else:
        _spawned(work, workers, render, done)
    results = [o[0] for o in outcomes if o is not None]
    tracebacks = [o[1] for o in outcomes if o is not None and o[1]]
    parts = [o[2] for o in outcomes if o is not None and o[2] is not None]
    return results, tracebacks, parts if render and len(parts) == len(results) else None


# What a forked pool costs before it gains anything: the forks, the copy-on-write of the pages each worker
# touches and the pipes; -j 2 against -j 1 on 2 to 12 static targets of the bench's fleet, on a 2-core box
# (docs/performance.md, 2026-12-04).
FORKED_POOL_COST_S = 0.007


def _keeps_this_process_forkable(opts: Options) -> bool:
    """Whether checking a target here leaves this process safe to fork: torch and mlx load only in a
    profile's probes (check.run_probes) and in the dry run, so a static check, or a full one under a
    profile without probes (hf), never loads them."""
    if opts.static:
        return True
    from kvdoctor.engines import check_profile

    return not opts.extra.get("dry_run") and not check_profile(opts.engine).probes()


def _here_until_a_pool_pays(work: list[tuple[str, Options]], workers: int, render: Render | None,
                            done: Done) -> int:
    """Check targets in this process, one at a time, until the rest would take long enough here that a
    pool of `workers` saves more than it costs; the number checked. A static check, or an hf one, takes
    milliseconds (a few of them ran slower at -j 2 than at -j 1), and neither loads torch or mlx, so this
    process stays safe to fork. The estimate is the mean of the checks so far, after the imports."""
    import time

    warm_imports(work)  # what the first check would import: not counted as checking
    spent = 0.0
    for i, (target, opts) in enumerate(work):
        rest = len(work) - i
        if i and spent / i * rest * (1 - 1 / min(workers, rest)) > FORKED_POOL_COST_S:
            return i
        began = time.perf_counter()
        done(range(i, i + 1), [_checked(target, opts, render)])
        spent += time.perf_counter() - began
    return len(work)


def _forked(work: list[tuple[str, Options]], workers: int, render: Render | None, done: Done,
            start: int = 0) -> None:
    """The batches from `start` on in worker processes forked from this one, after the imports every
    check needs: a worker starts in a millisecond and already holds the work list, so a task is two
    numbers on its pipe and its answer the pickled outcomes (no multiprocessing: its import and its
    threads were a fifth of the parent's time at 100 static checks). A worker that dies has its batch
    reported as such and is replaced while work is left."""
    import gc
    import pickle
    import select

    warm_imports(work)
    gc.freeze()  # what the parent holds stays out of the workers' collections (no copy-on-write)
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered here is written again by a worker
    todo = [range(start + b.start, start + b.stop) for b in batches(len(work) - start, workers)][::-1]  # input order
    pids: dict[int, int] = {}  # a worker's answers fd: its pid
    feeds: dict[int, int] = {}  # a worker's answers fd: its tasks fd, until closed
    running: dict[int, range] = {}  # a worker's answers fd: the batch it is checking

    def fork() -> int:
        tasks_r, tasks_w = os.pipe()
        answers_r, answers_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # each worker holds only its own ends, so each sees the end of its pipe
            _serve(tasks_r, answers_w, [tasks_w, answers_r, *pids, *feeds.values()], work, render)
        os.close(tasks_r)
        os.close(answers_w)
        pids[answers_r], feeds[answers_r] = pid, tasks_w
        return answers_r

    def send(answers: int) -> None:
        if not todo:
            os.close(feeds.pop(answers))  # the worker exits
            return
        running[answers] = batch = todo.pop()
        try:
            os.write(feeds[answers], f"{batch.start} {batch.stop}\n".encode())
        except BrokenPipeError:
            pass  # it died meanwhile: its answer reads as the end of the pipe

    try:
        for _ in range(workers):
            send(fork())
        while running:
            for answers in select.select(list(running), [], [])[0]:
                batch = running.pop(answers)
                data = _answer(answers)
                if data is not None:
                    send(answers)  # its next batch first: the worker checks it while this one is unpickled
                    done(batch, pickle.loads(data))
                    continue
                os.close(answers)
                os.close(feeds.pop(answers))
                why = _exit_reason(os.waitpid(pids.pop(answers), 0)[1])
                done(batch, [(died(*work[i], why), None, None) for i in batch])
                if todo:
                    send(fork())
    finally:
        for fd in (*pids, *feeds.values()):
            os.close(fd)
        for pid in pids.values():
            os.waitpid(pid, 0)


def _answer(fd: int) -> bytes | None:
    """A worker's answer: its length (8 bytes), then the pickle; None where the pipe ends before it."""
    head = _read(fd, 8)
    size = int.from_bytes(head, "little")
    data = _read(fd, size) if len(head) == 8 else b""
    return data if len(head) == 8 and len(data) == size else None


def _read(fd: int, size: int) -> bytes:
    """`size` bytes from a pipe, fewer only where it ends."""
    chunks = []
    while size and (chunk := os.read(fd, min(size, 1 << 20))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _exit_reason(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        import signal

        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _serve(tasks: int, answers: int, others: list[int], work: list[tuple[str, Options]],
           render: Render | None) -> None:
    """A forked worker's life: read a batch ("start stop"), answer with its outcomes, until the pipe
    ends; then its exit hooks, and it never returns into the parent's code."""
    code = 0
    _AT_EXIT.clear()  # the parent's are not this worker's
    try:
        import pickle

        for fd in others:
            os.close(fd)
        with os.fdopen(tasks, "rb") as inbox:
            for line in inbox:
                start, stop = map(int, line.split())
                data = pickle.dumps([_checked(*work[i], render) for i in range(start, stop)])
                view = memoryview(len(data).to_bytes(8, "little") + data)
                while view:
                    view = view[os.write(answers, view):]
    except BrokenPipeError:  # the parent stopped listening: it is exiting
        code = 1
    except Exception:  # noqa: BLE001 - a fault of the worker itself: shown, and its batch reported as died
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            for close in _AT_EXIT:
                close()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _spawned(work: list[tuple[str, Options]], workers: int, render: Render | None, done: Done) -> None:
    """The batches in a pool of spawned workers, each given the work list once when it starts."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_keep_work, initargs=(work, render)) as pool:
        futures = {pool.submit(_check_range, batch.start, batch.stop): batch
                   for batch in batches(len(work), workers)}
        for future in as_completed(futures):
            batch = futures[future]
            try:
                outcomes = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker died (out of memory, a crash in a kernel)
                outcomes = [(died(*work[i], f"{type(exc).__name__}: {exc}"), None, None) for i in batch]
            done(batch, outcomes)


def run_with_progress(work: list[tuple[str, Options]], jobs: int, show: bool = True,
                      render: Render | None = None) -> tuple[list[Result], list[str], list[Any] | None]:
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
