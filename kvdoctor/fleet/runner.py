"""Many targets in one run: expand folders of models, check them in parallel, keep the input order.

Checks are CPU-bound (they parse headers, build caches and run kernels), so with -j N they run in a
pool of N worker processes. Where the platform can fork (Linux), the workers are forked once the
parent has imported kvdoctor's checks, so a worker starts in milliseconds instead of importing
everything again; they are reused for every target (torch and mlx, which are not safe to fork, are
imported inside each worker on first use and then stay loaded). Checks that take a few milliseconds
and load neither (static ones, hf's) are also done in this process, which forks its helpers only
once the rest is enough to repay them, so a few targets are no slower at -j N than at -j 1.
Elsewhere the workers are spawned, and such checks are done in this process until the rest would
repay starting them (a tenth of a second or more). The results are the same, in the same order,
whatever the number of workers or the executor.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from kvdoctor.pipeline.check import Options, check_target
from kvdoctor.pipeline.diff import DIFF_TO, diff_target
from kvdoctor import worker_exit
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
        return (diff_target if opts.extra.get(DIFF_TO) else check_target)(target, opts), None
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
    from kvdoctor.report.fingerprint import sha256

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
    from kvdoctor.report.fingerprint import sha256

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

Done = Callable[[range, list[Outcome]], None]


def _check_here(work: list[tuple[str, Options]], i: int, render: Render | None, done: Done) -> float:
    """Check target `i` in this process and hand its outcome to `done`; the seconds it took."""
    import time

    began = time.perf_counter()
    done(range(i, i + 1), [_checked(*work[i], render)])
    return time.perf_counter() - began


def _deaths(work: list[tuple[str, Options]], batch: range, why: str) -> list[Outcome]:
    """The outcomes of a batch whose worker died."""
    return [(died(*work[i], why), None, None) for i in batch]


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
    here = workers > 1 and all(_is_light(opts) for _, opts in work)
    if workers <= 1:
        for i in range(len(work)):
            _check_here(work, i, render, done)
    elif FORKS:
        _forked(work, workers, render, done, here)
    else:
        _spawned(work, workers, render, done, here)
    results = [o[0] for o in outcomes if o is not None]
    tracebacks = [o[1] for o in outcomes if o is not None and o[1]]
    parts = [o[2] for o in outcomes if o is not None and o[2] is not None]
    return results, tracebacks, parts if render and len(parts) == len(results) else None


# What forked helpers cost before they gain anything: the forks, the copy-on-write of the pages each one
# touches and the pipes; -j 2 against -j 1 on 2 to 12 static targets of the bench's fleet, on a 2-core box
# (docs/performance.md, 2026-12-04).
FORKED_POOL_COST_S = 0.007
# The same for a pool of spawned workers (macOS, Windows), where each worker starts an interpreter and
# imports kvdoctor and every batch travels through multiprocessing's queues. Through Linux's spawn context,
# 4 static targets all pooled took 0.13 s longer at -j 2 than at -j 1, and 1,000 saved 0.77 s of the
# 1.05 s that half their checks take: 0.28 s (docs/performance.md, 2026-12-04).
SPAWNED_POOL_COST_S = 0.3
# The cheapest check measured: a static one of a folder with a config and no checkpoint (0.45 ms; the
# bench fleet's cheapest checkpoint took 1.1 ms, its mean 1.8 ms). Before any check is timed, the mean is
# taken to be this, so a fleet large enough to repay helpers even then forks them before its first check.
CHEAPEST_CHECK_S = 0.00045


def _is_light(opts: Options) -> bool:
    """Whether a check takes milliseconds and leaves this process safe to fork: torch and mlx load only
    in a profile's probes (check.run_probes) and in the dry run, so a static check, or a full one under
    a profile without probes (hf), never loads them. Such checks are done here too."""
    if opts.static:
        return True
    from kvdoctor.engines import check_profile

    return not opts.extra.get("dry_run") and not check_profile(opts.engine).probes()


def _helpers_pay(mean_s: float, rest: int, workers: int, cost_s: float) -> bool:
    """Whether `rest` checks of `mean_s` seconds each, spread over `workers` processes, save more than
    the `cost_s` of starting the helpers."""
    return mean_s * rest * (1 - 1 / min(workers, rest)) > cost_s


def _forked(work: list[tuple[str, Options]], workers: int, render: Render | None, done: Done, here: bool) -> None:
    """The work in `workers` processes, helpers forked from this one after the imports every check
    needs: a helper starts in a millisecond and already holds the work list and its batches. The
    batches wait in a _Queue, which every process reads when it is free, and a helper's answer is the
    pickled outcomes of its batch (no multiprocessing: its import and its threads were a fifth of the
    parent's time at 100 static checks). A helper that dies has its batch reported as such and is
    replaced while work may be left.

    With `here` (checks that leave this process safe to fork) this process is one of the workers: it
    starts alone and forks its helpers once the mean of its checks so far (before the first, the
    cheapest check measured) says that the rest repays them, so a few targets are no slower than at
    -j 1; and it pickles nothing of its own share."""
    import gc

    warm_imports(work)  # what the first check would import, before any fork and outside the estimate
    todo = batches(len(work), workers)
    queue = _Queue(len(todo))
    helpers: dict[int, _Helper] = {}  # a helper's answers fd: the helper
    answered = [False] * len(todo)

    def fork() -> None:
        import pickle  # noqa: F401 - what every helper and then this process need: imported once, here
        gc.freeze()  # what this process holds stays out of the helpers' collections (no copy-on-write)
        sys.stdout.flush()
        sys.stderr.flush()  # nothing buffered here is written again by a helper
        answers_r, answers_w = _answers_pipe()
        pid = os.fork()
        if pid == 0:  # each helper holds only its own ends, so each sees the end of its pipe
            _serve(queue.read_end, answers_w, [answers_r, *queue.write_ends(), *helpers], work, todo, render)
        os.close(answers_w)
        helpers[answers_r] = _Helper(pid)

    def collect(timeout: float | None) -> None:
        """The answers the helpers have sent, waiting up to `timeout` for one; the queue topped up."""
        import pickle  # here, where there are helpers: a few light targets never need it
        import select

        ready, writable, _ = select.select(list(helpers), queue.write_ends(), [], timeout)
        if writable:
            queue.top_up()
        for fd in ready:
            helper = helpers[fd]
            chunk = os.read(fd, 1 << 20)
            for index, data in helper.answers(chunk):
                answered[index] = True
                done(todo[index], pickle.loads(data))
            if chunk:
                continue
            os.close(fd)
            del helpers[fd]
            status = os.waitpid(helper.pid, 0)[1]
            if helper.claim is not None:
                answered[helper.claim] = True
                why = _exit_reason(status)
                done(todo[helper.claim], _deaths(work, todo[helper.claim], why))
            if os.waitstatus_to_exitcode(status) and not queue.drained:
                fork()  # one that finds the queue empty just ends

    try:
        if not here:
            for _ in range(workers):
                fork()
        pooled, checked, spent = not here, 0, 0.0  # pooled: the helpers were forked (once; deaths aside)
        while (index := queue.take() if here else None) is not None or helpers:
            if index is None:
                collect(None)
                continue
            for i in todo[index]:
                mean_s = spent / checked if checked else CHEAPEST_CHECK_S
                if not pooled and _helpers_pay(mean_s, len(work) - checked, workers, FORKED_POOL_COST_S):
                    pooled = True
                    for _ in range(min(workers, len(work) - checked) - 1):
                        fork()
                spent += _check_here(work, i, render, done)
                checked += 1
                if helpers:
                    collect(0)
            answered[index] = True
    finally:
        queue.close()
        for fd, helper in helpers.items():
            os.close(fd)
            os.waitpid(helper.pid, 0)
    for index, batch in enumerate(todo):  # claimed by a helper that died before it could say so
        if not answered[index]:
            done(batch, _deaths(work, batch, "before it reported its batch"))


class _Queue:
    """The batches' numbers in a pipe that every worker of a pool reads, as make's jobserver hands out
    its tokens: whichever is free takes the next (a read of one 4-byte number, which the kernel never
    splits between readers), so no worker waits to be handed work. Numbers the pipe cannot hold yet
    wait here and are written as it empties; this process takes those itself, so it never waits on a
    pipe that only it fills."""

    def __init__(self, count: int) -> None:
        self.read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)  # its own description: the readers' end stays blocking
        self._waiting = memoryview(b"".join(i.to_bytes(4, "little") for i in range(count)))
        self.drained = False  # this process has met the end of the queue
        self.top_up()

    def write_ends(self) -> list[int]:
        return [self._write_end] if self._write_end >= 0 else []

    def top_up(self) -> None:
        """As many waiting numbers as the pipe takes, PIPE_BUF bytes at a time (each write whole or
        refused); once all are in, the write end closes, and a read past the last number ends."""
        while self._waiting:
            try:
                self._waiting = self._waiting[os.write(self._write_end, self._waiting[:4096]):]
            except BlockingIOError:
                return
        self._close_write_end()

    def take(self) -> int | None:
        """The next batch's number for this process; None once there is none."""
        if self._waiting:
            record, self._waiting = self._waiting[:4], self._waiting[4:]
        else:
            record = os.read(self.read_end, 4)
        self.drained = not record
        return int.from_bytes(record, "little") if record else None

    def close(self) -> None:
        self._close_write_end()
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1

    def _close_write_end(self) -> None:
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1


class _Helper:
    """A forked helper, as this process sees it: its pid, the batch it said it took (until answered),
    and what it has sent that is not yet a whole message. A message is the batch's number and the
    length of its pickle (4 bytes each), then the pickle; a length of 0 announces that it took the batch."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.claim: int | None = None
        self._sent = bytearray()

    def answers(self, chunk: bytes) -> list[tuple[int, bytes]]:
        """The answers (batch number, pickle) that `chunk` completes."""
        self._sent += chunk
        out = []
        while len(self._sent) >= 8:
            index, size = int.from_bytes(self._sent[:4], "little"), int.from_bytes(self._sent[4:8], "little")
            if len(self._sent) < 8 + size:
                break
            if size:
                out.append((index, bytes(self._sent[8:8 + size])))
            self.claim = None if size else index
            del self._sent[:8 + size]
        return out


ANSWERS_PIPE_BYTES = 1 << 20  # a batch's answer with its JSON entries is some 70 KB, over a pipe's 64 KiB


def _answers_pipe() -> tuple[int, int]:
    """A pipe that holds a few of a helper's answers, so that the helper does not wait for this
    process to be done with the check it is doing before it reads them; where the system refuses
    (above /proc/sys/fs/pipe-max-size, or out of the user's pipe pages), an ordinary one."""
    import fcntl

    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, ANSWERS_PIPE_BYTES)
    except OSError:
        pass
    return read_end, write_end


def _send(fd: int, index: int, data: bytes) -> None:
    """One message to the parent (see _Helper)."""
    view = memoryview(index.to_bytes(4, "little") + len(data).to_bytes(4, "little") + data)
    while view:
        view = view[os.write(fd, view):]


def _exit_reason(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        import signal

        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _serve(queue: int, answers: int, others: list[int], work: list[tuple[str, Options]], todo: list[range],
           render: Render | None) -> None:
    """A forked helper's life: take a batch from the queue, say so, answer with its outcomes, until the
    queue ends; then its exit hooks, and it never returns into the parent's code."""
    code = 0
    worker_exit.forget_parents_hooks()
    try:
        import pickle

        for fd in others:
            os.close(fd)
        while record := os.read(queue, 4):
            index = int.from_bytes(record, "little")
            _send(answers, index, b"")  # should this helper die now, the batch is reported as died
            _send(answers, index, pickle.dumps([_checked(*work[i], render) for i in todo[index]]))
    except BrokenPipeError:  # the parent stopped listening: it is exiting
        code = 1
    except Exception:  # noqa: BLE001 - a fault of the helper itself: shown, and its batch reported as died
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            worker_exit.run_hooks()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _spawned(work: list[tuple[str, Options]], workers: int, render: Render | None, done: Done, here: bool) -> None:
    """The batches in a pool of spawned workers, each given the work list once when it starts. With
    `here` (light checks), the targets are checked in this process, in order, until the mean so far
    (the first check left out: it pays what only a first one does) says the rest repays starting the
    pool; only the rest goes to it, so that a few targets are not slower at -j N than at -j 1 where a
    worker takes a tenth of a second to start."""
    if here:
        warm_imports(work)  # what the first check would import: outside the estimate
    start, spent = 0, 0.0  # spent: on the checks after the first
    while here and start < len(work):
        if start > 1 and _helpers_pay(spent / (start - 1), len(work) - start, workers, SPAWNED_POOL_COST_S):
            break
        took = _check_here(work, start, render, done)
        if start:
            spent += took
        start += 1
    if start == len(work):
        return
    import multiprocessing  # only for a pool: with concurrent.futures, some 15 ms of imports
    from concurrent.futures import ProcessPoolExecutor, as_completed

    rest = [range(start + b.start, start + b.stop) for b in batches(len(work) - start, workers)]
    with ProcessPoolExecutor(max_workers=min(workers, len(work) - start), initializer=_keep_work,
                             mp_context=multiprocessing.get_context("spawn"), initargs=(work, render)) as pool:
        futures = {pool.submit(_check_range, batch.start, batch.stop): batch for batch in rest}
        for future in as_completed(futures):
            batch = futures[future]
            try:
                outcomes = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker died (out of memory, a crash in a kernel)
                outcomes = _deaths(work, batch, f"{type(exc).__name__}: {exc}")
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
