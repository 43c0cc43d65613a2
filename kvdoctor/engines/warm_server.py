"""The child side of a warm dry-run child: import once, then run each request in a fork of itself.

Standard library only: it also runs as a script under an engine's own Python, which has no kvdoctor
(`python -P warm_server.py SCRIPT --answer-fd N --key JSON`, for a child script that defines
`preload(key)` and `main()`; see kvdoctor/engines/child.py). The sglang-mlx dry run uses `serve` from
kvdoctor/engines/sglang_mlx/dryrun/child.py.

Why a fork per request rather than running the requests one after another in the warm process: a dry
run changes its process in ways that would show in the next model's result. Environment variables
set from the deploy settings, engine functions swapped for the length of a run, module-level caches
(`lru_cache`, the runtime context singletons), the engine's model modules imported on first use
(from then on their module code, and the first trace of every `mx.compile`d function, no longer run,
so the engine-code trace of a second model of a family would lose functions), MLX's buffer cache and
random state. A fork taken after the imports and before any of that starts each request from the
state a fresh child has at the same point, and throws everything away when it exits. Forking is safe
only while the imports have started no thread (MLX's and torch's pools start on first compute, not on
import): `serve` checks that before it says it is ready, and refuses otherwise.

Protocol, one JSON object a line. The parent writes jobs to stdin: {"stderr", "cwd", ...} plus what
`run_one` reads. The warm child answers on the descriptor --answer-fd: first {"ready": true, "pid"}
(or {"ready": false, "reason"}, and it exits), then one {"returncode", "rss_bytes"} per job, where
returncode is the fork's as subprocess reports it (negative: killed by that signal) and rss_bytes is
the warm process's own resident memory afterwards. EOF on stdin (the parent closed it or died) ends it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback
from typing import Any, Callable

Job = dict[str, Any]


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def rss_bytes() -> int:
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


def die_with_parent() -> None:
    """Linux: be killed when the process that started this one ends, however it ends."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _run_forked(job: Job, run_one: Callable[[Job], int], control: Any, answer: Any) -> tuple[int, bool]:
    """Run one job in a fork; (its returncode, whether the parent closed the control pipe meanwhile)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the job's own process, which never returns from here
        code = 1
        try:
            die_with_parent()
            answer.close()
            null = os.open(os.devnull, os.O_RDONLY)  # as a one-shot child's stdin
            os.dup2(null, 0)
            os.close(null)
            out = os.open(job["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(out, 1)  # the engine's native output lands in the job's own file too
            os.dup2(out, 2)
            os.close(out)
            os.chdir(job["cwd"])
            code = run_one(job)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported as a one-shot child's interpreter would
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
            closed = True  # the parent is gone: stop the job and leave
            os.kill(pid, signal.SIGKILL)
    return (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), closed


def serve(preload: Callable[[], str | None], run_one: Callable[[Job], int], answer_fd: int) -> int:
    """`preload()` imports what every job needs (None, or why this process cannot serve); then one fork
    per job read from stdin runs `run_one(job)`."""
    die_with_parent()
    answer = os.fdopen(answer_fd, "w", buffering=1)
    control = sys.stdin.buffer
    try:  # numpy's BLAS starts its threads on import; they are fork-safe (it stops them around a fork)
        import numpy  # noqa: F401
    except ImportError:
        pass
    before = threads()
    reason = preload()
    if reason is None and threads() != before:
        reason = f"the imports started threads ({before} -> {threads()}); forking would not be safe"
    if reason is not None:
        answer.write(json.dumps({"ready": False, "reason": reason}) + "\n")
        return 0
    answer.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in iter(control.readline, b""):
        returncode, closed = _run_forked(json.loads(line), run_one, control, answer)
        if closed:
            break
        answer.write(json.dumps({"returncode": returncode, "rss_bytes": rss_bytes()}) + "\n")
    return 0


def _serve_script(script: str, answer_fd: int, key: Any) -> int:
    """A child script as a warm child: its `preload(key)`, then its `main()` per job (job["argv"])."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvdoctor_warm_script", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module

    def preload() -> str | None:
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]  # checked above
            module.preload(key)
        except Exception as exc:  # noqa: BLE001 - then it cannot serve; the one-shot child reports
            return f"preload failed: {type(exc).__name__}: {exc}"
        return None

    def run_one(job: Job) -> int:
        sys.argv = [script, *job["argv"]]
        module.main()
        return 0

    return serve(preload, run_one, answer_fd)


if __name__ == "__main__":
    _args = sys.argv[1:]
    sys.exit(_serve_script(_args[0], int(_args[_args.index("--answer-fd") + 1]),
                           json.loads(_args[_args.index("--key") + 1])))
