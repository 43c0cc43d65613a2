"""The parent side of warm dry-run children (the child side, and why a fork per request:
warm_server.py): one per kind of dry run and kvdoctor process, reused for request after request.

A -j worker is a fork of the CLI, so children are keyed by the process id of the process that
started them: a worker never uses (nor closes) its parent's. A warm child is dropped and the next
request starts a new one when a request ran past its time bound (its whole process group is killed),
when the child or the request's process ended abnormally, when its resident memory after a request is
past the bound the caller gives, or when the next request needs other imports (its key differs). At
exit (atexit, and a -j worker's exit hooks or multiprocessing's finalizers, which are what it runs) every
warm child of the process is closed; a warm child also dies with the process that started it (Linux),
and its request's fork with it.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import msgspec

SERVER = Path(__file__).resolve().parent / "warm_server.py"


def available() -> bool:
    """Warm children fork after importing torch / MLX; that is known to hold only on Linux."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def _kill_group(proc: subprocess.Popen, settle: float = 5.0) -> None:
    """Kill the warm child and its request's fork; return once the group is gone (a large fork takes a
    moment to release its memory after SIGKILL) or `settle` seconds passed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if live_members(proc.pid) == []:
            return
        time.sleep(0.02)


def live_members(pgid: int) -> list[int] | None:
    """Linux: the process ids in group `pgid` that have not exited (zombies, awaiting their reaper,
    left out); None when /proc cannot be read."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    members = []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


class WarmChild:
    """One warm child process (it leads its own session: its requests' forks are in its group)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], preexec_fn: Callable[[], None] | None = None):
        self.owner = os.getpid()
        self.dir = tempfile.TemporaryDirectory(prefix="kvdoctor-dryrun-warm-")
        self.log = open(Path(self.dir.name) / "warm-stderr.txt", "w+")  # its own output, before any request
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen([*argv, "--answer-fd", str(write_end)], stdin=subprocess.PIPE,
                                         stdout=self.log, stderr=self.log, pass_fds=(write_end,), env=dict(env),
                                         cwd=self.dir.name, start_new_session=True, preexec_fn=preexec_fn)
        except BaseException:
            os.close(read_end)
            self.log.close()
            self.dir.cleanup()
            raise
        finally:
            os.close(write_end)
        self.answers = os.fdopen(read_end, "rb", buffering=0)
        self.pending = b""
        self.ready = False

    def read_answer(self, deadline: float, tick: Callable[[], None] | None) -> tuple[dict[str, Any] | None, bool]:
        """The next answer; (None, True) when the deadline passed first, (None, False) when the child
        closed its end (it ended)."""
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True
            if not select.select([self.answers], [], [], min(0.25, left))[0]:
                if tick is not None:
                    tick()
                continue
            chunk = os.read(self.answers.fileno(), 4096)
            if not chunk:
                return None, False
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        try:
            return json.loads(line), False
        except json.JSONDecodeError:
            return None, False

    def send(self, job: Mapping[str, Any]) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except OSError:  # it ended before it could take the job
            return False

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def kill(self) -> None:
        _kill_group(self.proc)
        self._release()

    def close(self) -> None:
        """Ask it to leave (EOF on its stdin); then kill whatever is left of its group."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _kill_group(self.proc)
        self._release()

    def _release(self) -> None:
        for handle in (self.answers, self.log, self.proc.stdin):
            try:
                if handle:
                    handle.close()
            except OSError:
                pass
        self.dir.cleanup()


_CHILDREN: dict[tuple[int, str], tuple[Any, WarmChild]] = {}  # (owner pid, kind) -> (key, child)
_REFUSED: set[tuple[int, str, str]] = set()  # (pid, kind, key) whose warm child said it cannot serve
_REGISTERED: set[int] = set()


def pid_of(kind: str) -> int | None:
    """The process id of this process's warm child of `kind`, if one is alive."""
    entry = _CHILDREN.get((os.getpid(), kind))
    return None if entry is None else entry[1].proc.pid


def drop(kind: str, kill: bool = False) -> None:
    entry = _CHILDREN.pop((os.getpid(), kind), None)
    if entry is not None:
        entry[1].kill() if kill else entry[1].close()


def close_all() -> None:
    """Close every warm child this process started (at exit; when a -j worker ends)."""
    for owner, kind in list(_CHILDREN):
        if owner == os.getpid():
            drop(kind)


def _register_close() -> None:
    if os.getpid() in _REGISTERED:
        return
    _REGISTERED.add(os.getpid())
    atexit.register(close_all)
    # -j workers leave through os._exit, where atexit does not run: a forked worker runs its exit
    # hooks, a spawned one (multiprocessing) its finalizers.
    from multiprocessing import util

    from kvdoctor.worker_exit import at_worker_exit

    at_worker_exit(close_all)
    util.Finalize(None, close_all, exitpriority=10)


class WarmOutcome(msgspec.Struct):
    returncode: int | None
    timed_out: bool
    stderr: str  # the request's output (and the warm child's own, when it started for this request)


def run(kind: str, key: Any, argv: Sequence[str], env: Mapping[str, str], job: dict[str, Any], stderr_path: Path,
        timeout: float, rss_bound: int, tick: Callable[[], None] | None = None,
        preexec_fn: Callable[[], None] | None = None) -> WarmOutcome | None:
    """Run `job` through this process's warm child of `kind` (started with `argv` + --answer-fd when
    none with the same `key`, argv and env is alive). None when a warm child cannot serve here: the caller runs a
    one-shot child then (and from then on for this key)."""
    pid = os.getpid()
    # what the child imported depends on its key and on its whole environment (a test, or the caller,
    # may change ours between requests): a child started under other ones is replaced
    marker = hashlib.sha256(json.dumps([key, argv, sorted(env.items())], sort_keys=True,
                                       default=str).encode()).hexdigest()
    if (pid, kind, marker) in _REFUSED:
        return None
    started = time.monotonic()
    deadline = started + timeout
    entry = _CHILDREN.get((pid, kind))
    if entry is not None and (entry[0] != marker or entry[1].proc.poll() is not None):
        drop(kind, kill=entry[1].proc.poll() is not None)
        entry = None
    fresh = entry is None
    if entry is None:
        _register_close()
        entry = _CHILDREN[(pid, kind)] = (marker, WarmChild(argv, env, preexec_fn))
    child = entry[1]
    stderr_path.touch()
    answer, late = None, False
    if not child.ready:
        answer, late = child.read_answer(deadline, tick)
        if answer is not None and not answer.get("ready"):
            _REFUSED.add((pid, kind, marker))
            drop(kind)
            return None
        child.ready = answer is not None
    if child.ready:
        answer, late = (child.read_answer(deadline, tick) if child.send({**job, "stderr": str(stderr_path)})
                        else (None, False))
    stderr = (child.log_text() if fresh else "") + stderr_path.read_text(errors="replace")
    if late:
        drop(kind, kill=True)
        return WarmOutcome(None, True, stderr)
    if answer is None:  # the warm child itself ended mid-request: its exit status stands for the request's
        _kill_group(child.proc)
        stderr = stderr if fresh else stderr + child.log_text()
        returncode = child.proc.returncode
        drop(kind, kill=True)
        return WarmOutcome(returncode, False, stderr)
    returncode = int(answer["returncode"])
    if returncode != 0 or int(answer.get("rss_bytes") or 0) > rss_bound:
        drop(kind)  # nothing to trust after a crash; a child past the memory bound retires
    return WarmOutcome(returncode, False, stderr)
