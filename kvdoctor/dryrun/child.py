"""Entry point of the dry run's child process.

`python -m kvdoctor.dryrun.child REQUEST.json EVENTS.jsonl` runs one dry run (the one-shot child).
`python -m kvdoctor.dryrun.child --serve` is the warm child (run.py keeps one per kvdoctor process):
it imports the engine once, then serves one request after another, each in a fresh fork of itself.

The engine is loaded, patched and run only here, never in the CLI's own process: its modules are
imported in an unusual way (engine_import.py), a trusted checkpoint's model code may run, and the
parent must be able to stop a run that outlives its time bound. Events are appended to EVENTS one JSON
object a line and flushed at once, so whatever happened before a kill is still there.

Why a fork per request rather than running the requests one after another in the warm child itself:
a dry run changes its process in ways that would show in the next model's events. The deploy
settings become environment variables (apply_environment); the driver swaps `mlx_lm_load` on the
engine's runner module and MLX's `gather_mm` and SDPA for the length of a run; mlx-lm imports the
model family's module on first use, and from then on its module code, and the first trace of every
`mx.compile`d function, no longer runs; so the engine-code trace (CodeTracer) of a second model of
the same family would lose functions. MLX's buffer cache, cache limit and random state carry over
too. A fork taken after the imports and before any of that starts each request from the same state
as a fresh child at the moment it starts the dry run, and throws the state away with the fork.
Forking is safe only while no MLX or torch compute has started a thread (their pools are created on
first use, not on import); the warm child checks that before it answers that it is ready.

Protocol (one JSON object a line): the parent writes requests to the warm child's stdin
{"request", "events", "stderr", "cwd"}; the warm child answers on the descriptor named by --answer-fd:
first {"ready": true, "pid"} (or {"ready": false, "reason"} and exits), then per request
{"returncode", "rss_bytes"} (its own resident memory after the fork ended). EOF on stdin ends it.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import traceback
from pathlib import Path
from typing import IO, Any


def main(argv: list[str]) -> int:
    request_path, events_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from kvdoctor.dryrun.driver import DryRun, apply_environment

    apply_environment(request.get("deploy", {}))
    with events_path.open("a", encoding="utf-8") as out:
        def emit(event: dict) -> None:
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()

        DryRun(request, emit).run()
    return 0


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _die_with_parent() -> None:
    """Linux: be killed when the process that started this one ends, however it ends."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _preload() -> str | None:
    """Import what a dry run imports before its first stage; None when forking is safe after it."""
    import numpy  # noqa: F401 - its BLAS starts its threads on import; they are fork-safe (atfork handlers)

    before = _threads()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from kvdoctor.dryrun import driver  # noqa: F401
    from kvdoctor.dryrun.engine_import import EngineUnavailable, load_mlx_backend

    try:
        load_mlx_backend()
    except EngineUnavailable as exc:
        return f"engine unavailable: {exc}"
    if _threads() != before:
        return f"the engine's imports started threads ({before} -> {_threads()}); forking would not be safe"
    return None


def _run_forked(job: dict[str, Any], control: Any, answer: IO[str]) -> tuple[int, bool]:
    """Run one request in a fork; returns (its returncode as subprocess reports it, whether the parent
    closed the control pipe meanwhile)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the request's own process
        code = 1
        try:
            _die_with_parent()
            answer.close()
            null = os.open(os.devnull, os.O_RDONLY)  # as the one-shot child's stdin
            os.dup2(null, 0)
            os.close(null)
            fd = os.open(job["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(fd, 1)  # the engine's native output lands in the request's own file too
            os.dup2(fd, 2)
            os.close(fd)
            os.chdir(job["cwd"])
            code = main([job["request"], job["events"]])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported as the one-shot child's interpreter would
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    closed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if not closed and select.select([control], [], [], 0.1)[0] and not control.peek(1):
            closed = True  # the parent is gone: stop the request and leave
            os.kill(pid, signal.SIGKILL)
    return (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), closed


def serve(answer_fd: int) -> int:
    _die_with_parent()
    answer = os.fdopen(answer_fd, "w", buffering=1)
    control = sys.stdin.buffer
    reason = _preload()
    if reason is not None:
        answer.write(json.dumps({"ready": False, "reason": reason}) + "\n")
        return 0
    answer.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in iter(control.readline, b""):
        returncode, closed = _run_forked(json.loads(line), control, answer)
        if closed:
            break
        answer.write(json.dumps({"returncode": returncode, "rss_bytes": _rss_bytes()}) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(int(sys.argv[sys.argv.index("--answer-fd") + 1])))
    sys.exit(main(sys.argv[1:]))
