"""The warm dry-run child (kvdoctor.engines.sglang_mlx.dryrun.child --serve, run.py): one engine import for many models.

Its promise is that a model's events are the ones a fresh one-shot child reports (timing apart), and
that no process outlives a request killed at its bound, a crash, or the kvdoctor process itself.
These run the real engine (sglang's MLX runner) on config-only fixture models, as the bench does.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import REAL, ROOT, masked
from kvdoctor.engines.sglang_mlx.dryrun import run
from kvdoctor.engines.sglang_mlx.dryrun.engine_import import missing_packages
from kvdoctor.engines import warm

pytestmark = [
    pytest.mark.skipif(bool(missing_packages()), reason=f"engine not installed: {', '.join(missing_packages())}"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm child forks (Linux only)"),
]

TIMING = {"seconds", "estimated_seconds", "time", "rss", "rss_bytes"}


def request_for(name: str) -> dict[str, Any]:
    from kvdoctor.engines.sglang_mlx.profile import SglangMlxSettings
    from kvdoctor.load.loader import load_model

    spec = load_model(str(REAL / name), with_checkpoint=False)
    return run.build_request(spec, SglangMlxSettings(), {})


def warm_pid() -> int | None:
    return warm.pid_of(run.WARM_KIND)


@pytest.fixture
def fresh_warm():
    run.close_warm()
    yield
    pid = warm_pid()
    run.close_warm()
    if pid is not None:
        assert warm.live_members(pid) == []


def test_events_through_one_warm_child_equal_a_fresh_childs(fresh_warm):
    names = ["openai__gpt-oss-20b", "google__gemma-3-1b-it", "meta-llama__Llama-3.1-8B"]
    fresh = {name: run._launch_one_shot(request_for(name), 300) for name in names}
    served_by = set()
    # the first model comes back last: its family's module and compiled functions were loaded in the
    # warm child's fork before, and must run (and be traced) again
    for name in names + names[:1]:
        reused = run.launch(request_for(name), 300)
        served_by.add(warm_pid())
        one = fresh[name]
        assert (reused.returncode, reused.timed_out) == (one.returncode, one.timed_out) == (0, False)
        assert reused.first("done") is not None
        assert [e["event"] for e in reused.events] == [e["event"] for e in one.events], name
        for a, b in zip(reused.events, one.events):
            assert masked(a, TIMING) == masked(b, TIMING), (name, a.get("event"))
    assert len(served_by) == 1 and None not in served_by
    assert any("<module>" in functions for functions in fresh[names[0]].first("engine_code")["files"].values())


def _written(pid: int) -> int:
    """Bytes process `pid` has written so far (its events go out one flushed line at a time)."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def test_a_request_killed_at_its_bound_leaves_no_process_and_the_next_one_runs(fresh_warm):
    llama = request_for("meta-llama__Llama-3.1-8B")
    first = run.launch(llama, 300)  # starts the warm child
    pid = warm_pid()
    assert first.returncode == 0 and pid is not None
    stopped: list[int] = []

    def stop_the_fork_once_it_has_reported() -> None:
        """The request's own process is stopped (SIGSTOP) after its first event, so it can only end at
        its bound, however fast or loaded the machine is."""
        while not stopped:
            for fork in (p for p in warm.live_members(pid) if p != pid):
                try:
                    if _written(fork) > 0:
                        os.kill(fork, signal.SIGSTOP)
                        stopped.append(fork)
                except (OSError, StopIteration):  # not started writing, or gone
                    pass
            time.sleep(0.001)

    thread = threading.Thread(target=stop_the_fork_once_it_has_reported, daemon=True)
    thread.start()
    killed = run.launch(request_for("Qwen__Qwen3-Next-80B-A3B-Instruct"), 10)
    thread.join(timeout=1)
    assert stopped and killed.timed_out and killed.returncode is None
    assert warm_pid() is None and warm.live_members(pid) == []
    assert killed.first("done") is None and killed.first("versions") is not None  # what it saw is kept
    again = run.launch(llama, 300)
    assert again.returncode == 0 and warm_pid() not in (None, pid)
    assert masked(again.events, TIMING) == masked(first.events, TIMING)


def test_a_request_whose_process_dies_reports_its_signal_and_the_next_gets_a_fresh_child(fresh_warm):
    llama = request_for("meta-llama__Llama-3.1-8B")
    assert run.launch(llama, 300).returncode == 0
    pid = warm_pid()
    assert pid is not None
    killed: list[int] = []

    def kill_the_fork() -> None:  # the request's own process: the one member of the group besides pid
        for _ in range(400):
            forks = [p for p in warm.live_members(pid) if p != pid]
            if forks:
                os.kill(forks[0], signal.SIGSEGV)
                killed.append(forks[0])
                return
            time.sleep(0.01)

    thread = threading.Thread(target=kill_the_fork)
    thread.start()
    crashed = run.launch(request_for("openai__gpt-oss-20b"), 300)
    thread.join()
    assert killed and crashed.returncode == -signal.SIGSEGV and not crashed.timed_out
    assert warm_pid() is None and warm.live_members(pid) == []  # never reused after a crash
    again = run.launch(llama, 300)
    assert again.returncode == 0 and again.first("done") is not None and warm_pid() not in (None, pid)


def test_a_warm_child_past_the_memory_bound_is_retired(fresh_warm, monkeypatch):
    monkeypatch.setattr(run, "WARM_RSS_BOUND", 1)
    outcome = run.launch(request_for("meta-llama__Llama-3.1-8B"), 300)
    assert outcome.returncode == 0 and outcome.first("done") is not None
    assert warm_pid() is None


def test_trusted_remote_code_never_runs_in_the_warm_child(fresh_warm, monkeypatch):
    seen = []
    monkeypatch.setattr(run, "_launch_one_shot", lambda request, timeout: seen.append(request) or run.ChildOutcome())
    request = {**request_for("meta-llama__Llama-3.1-8B"), "trust_remote_code": True}
    run.launch(request, 300)
    assert seen == [request] and warm_pid() is None


def _processes_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_no_child_outlives_the_cli(tmp_path, jobs):
    """The CLI dry-runs two models (with -j 2, in two forked workers, each with its own warm child);
    once it has exited, no process it started is left, nor any warm child's folder."""
    marker = f"KVDOCTOR_WARM_TEST={os.getpid()}-{jobs}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), marker.split("=")[0]: marker.split("=")[1], "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "kvdoctor", "check", str(REAL / "meta-llama__Llama-3.1-8B"),
                           str(REAL / "mistralai__Mistral-7B-v0.1"), "--engine", "sglang-mlx", "--dry-run",
                           "--format", "json", "-j", jobs], capture_output=True, text=True, env=env, timeout=600)
    results = json.loads(proc.stdout)["results"]
    assert [r["info"]["dry_run"]["outcome"] for r in results] == ["clean", "clean"], proc.stderr[-2000:]
    time.sleep(0.5)
    assert _processes_with(marker) == []
    assert list(tmp_path.glob("kvdoctor-dryrun-warm-*")) == []
