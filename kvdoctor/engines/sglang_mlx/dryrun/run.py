"""Start a dry run in a child process, bound it in time, and read back what it reported.

The CLI's process never imports the engine: it checks that the packages exist, writes the request,
hands it to a child, and kills the child's whole process group when the time bound runs out. The
child appends events as it goes, so a killed run still says how far it got.

The child is a warm one where it can be (Linux): `python -m kvdoctor.engines.sglang_mlx.dryrun.child --serve`, started
once per kvdoctor process (per -j worker: keyed by the process id) on its first dry run, imports the
engine once and runs each request in a fork of itself, so every model starts from the state a fresh
child has (kvdoctor/engines/warm_server.py says why a fork). It is dropped, and the next request starts a new one, when a
request ran out of time or did not end cleanly, when its memory grew past the dry run's bound, and it
is closed when the process ends. A request with trust_remote_code (the checkpoint's own code runs) always
gets a one-shot child of its own: `python -m kvdoctor.engines.sglang_mlx.dryrun.child REQUEST EVENTS`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import msgspec

DEFAULT_TIMEOUT_SECONDS = 300.0
STDERR_TAIL = 2000
# A warm child whose resident memory after a request is past the dry run's bound (docs/performance.md:
# 2 GiB) is retired; its forks are measured on their own.
WARM_RSS_BOUND = 2 * 1024**3
MLX_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32",
              "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


class ChildOutcome(msgspec.Struct):
    """Everything the child reported, plus how it ended."""

    events: list[dict[str, Any]] = msgspec.field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stderr_tail: str = ""
    timeout: float = DEFAULT_TIMEOUT_SECONDS

    def first(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == name), None)

    def all(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]


def kv_dtype(spec: Any) -> str | None:
    """The dtype the shrunk model's weights get: an attention layer's key-projection dtype when the
    checkpoint shows it, else the config's."""
    for layer in spec.layers:
        if layer.dtype in MLX_DTYPES and "dtype" in layer.sources:
            return MLX_DTYPES[layer.dtype]
    return MLX_DTYPES.get(spec.dtype or "")


def build_request(spec: Any, settings: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model_dir": str(Path(spec.model_dir).resolve()),
        "config": spec.raw_config,
        "dtype": kv_dtype(spec),
        "trust_remote_code": bool(options.get("trust_remote_code")),
        "deploy": {"radix_cache": settings.radix_cache, "pool_size": settings.pool_size,
                   "chunked_prefill_size": settings.chunked_prefill_size,
                   "use_custom_rope": settings.use_custom_rope},
        "budget_seconds": options.get("dry_run_budget"),
    }


def launch(request: dict[str, Any], timeout: float) -> ChildOutcome:
    """Run the dry run in a child and collect its events; never raises for what happens inside the child."""
    from kvdoctor.engines import warm

    if request.get("trust_remote_code") or not warm.available():
        return _launch_one_shot(request, timeout)
    return _launch_warm(request, timeout)


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}  # nothing may reach the network


def _launch_one_shot(request: dict[str, Any], timeout: float) -> ChildOutcome:
    """A child of its own for this request."""
    outcome = ChildOutcome(timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="kvdoctor-dryrun-") as tmp:
        request_path, events_path = _write_request(Path(tmp), request)
        started = time.monotonic()
        with open(Path(tmp) / "stderr.txt", "w+") as stderr:
            proc = subprocess.Popen([sys.executable, "-m", "kvdoctor.engines.sglang_mlx.dryrun.child", str(request_path),
                                     str(events_path)], stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                                    env=_child_env(), cwd=tmp, start_new_session=True)
            outcome.returncode, outcome.timed_out = _wait(proc, timeout, events_path)
            outcome.seconds = round(time.monotonic() - started, 2)
            stderr.seek(0)
            outcome.stderr_tail = stderr.read()[-STDERR_TAIL:]
        outcome.events = _read_events(events_path)
    return outcome


def _write_request(tmp: Path, request: dict[str, Any]) -> tuple[Path, Path]:
    request_path, events_path = tmp / "request.json", tmp / "events.jsonl"
    request_path.write_text(json.dumps(request))
    events_path.touch()
    return request_path, events_path


def _read_events(events_path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for line in events_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut short by the kill
        if event.get("event") == "restart":  # the run was repeated (driver.py): keep the repeat only
            events = [e for e in events if e.get("event") == "versions"]
        events.append(event)
    return events


# -- the warm child ---------------------------------------------------------------------------------

WARM_KIND = "sglang-mlx"


def close_warm() -> None:
    """Close this process's warm dry-run child, if it has one (it is also closed at exit)."""
    from kvdoctor.engines import warm

    warm.drop(WARM_KIND)


def _launch_warm(request: dict[str, Any], timeout: float) -> ChildOutcome:
    """The request through this process's warm child (kvdoctor.engines.warm), started first if none is
    alive; a one-shot child when a warm one cannot serve here."""
    from kvdoctor.engines import warm
    from kvdoctor.progress import update

    outcome = ChildOutcome(timeout=timeout)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvdoctor-dryrun-") as tmp:
        request_path, events_path = _write_request(Path(tmp), request)
        watcher = _StageWatcher(events_path)
        result = warm.run(WARM_KIND, sys.executable, [sys.executable, "-m", "kvdoctor.engines.sglang_mlx.dryrun.child", "--serve"],
                          _child_env(), {"request": str(request_path), "events": str(events_path), "cwd": tmp},
                          Path(tmp) / "stderr.txt", timeout, WARM_RSS_BOUND, tick=lambda: update(watcher.poll()))
        if result is None:
            return _launch_one_shot(request, max(0.0, started + timeout - time.monotonic()))
        outcome.seconds = round(time.monotonic() - started, 2)
        outcome.returncode, outcome.timed_out = result.returncode, result.timed_out
        outcome.stderr_tail = result.stderr[-STDERR_TAIL:]
        outcome.events = _read_events(events_path)
    if outcome.returncode == 0 and outcome.first("done") is None:
        close_warm()  # it ended without finishing the dry run: not to be trusted again
    return outcome


def _wait(proc: subprocess.Popen, timeout: float, events_path: Path) -> tuple[int | None, bool]:
    """Wait for the child, telling the progress display which stage and step it reached; kill it
    at the time bound. Returns (returncode, timed_out)."""
    from kvdoctor.progress import update

    deadline = time.monotonic() + timeout
    watcher = _StageWatcher(events_path)
    while True:
        try:
            return proc.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic()))), False
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                _kill_group(proc)
                return None, True
        update(watcher.poll())


class _StageWatcher:
    """Reads the child's events as they are appended and says where the dry run is."""

    def __init__(self, path: Path):
        self.path, self.offset, self.text = path, 0, "dry run: starting the engine"
        self.steps: int | None = None

    def poll(self) -> str:
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event")
            if kind == "stage" and event.get("status") == "started":
                self.text = f"dry run: {event.get('stage')}"
            elif kind == "schedule" and event.get("chosen"):
                self.steps = len(event.get("steps") or [])
            elif kind == "step":
                stage = self.text.split(",")[0]
                self.text = f"{stage}, {event.get('number', 0) + 1} of {self.steps or '?'} steps done"
        return self.text


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the child and anything it started: it leads its own session (process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
