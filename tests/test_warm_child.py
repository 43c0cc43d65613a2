"""The warm-child machinery on its own (kvdoctor.engines.warm, warm_server.py, run_child's warm_key), with
a small child script instead of an engine: fast, and it shows each property without an engine's noise.
"""
from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvdoctor.engines import warm
from kvdoctor.engines.child import run_child

pytestmark = pytest.mark.skipif(not warm.available(), reason="warm children fork (Linux only)")

SCRIPT = textwrap.dedent('''
    import json, os, signal, sys, time
    from pathlib import Path

    STATE = {"preloaded": 0, "runs": 0}

    def preload(key):
        STATE["preloaded"] += 1
        if key.get("start_a_thread"):
            import threading
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()

    def main():
        request = json.loads(Path(sys.argv[1]).read_text())
        STATE["runs"] += 1
        os.environ["LEAKED"] = "yes"  # must not reach the next request
        print("output of", request["name"], flush=True)
        Path(sys.argv[2]).write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "state": dict(STATE),
                                                 "leaked_before": request.get("check_env") and os.environ.get("SEEN"),
                                                 "cwd": os.getcwd(), "stdin": sys.stdin.read()}))
        os.environ["SEEN"] = "yes"
        if request.get("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if request.get("sleep"):
            time.sleep(request["sleep"])

    if __name__ == "__main__":
        STATE["preloaded"] = -1  # a one-shot run never preloads
        main()
''')


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "child_script.py"
    path.write_text(SCRIPT)
    yield path
    warm.drop(str(path))


def call(script: Path, tmp_path: Path, name: str, key: dict | None = None, timeout: float = 30, **request):
    folder = tmp_path / f"{name}-{time.monotonic_ns()}"
    folder.mkdir()
    return run_child(Path(sys.executable), script, folder, {"name": name, **request}, {}, timeout,
                     warm_key={} if key is None else key)


def test_each_request_runs_in_a_fresh_fork_of_one_preloaded_child(script, tmp_path):
    first = call(script, tmp_path, "a")
    server = warm.pid_of(str(script))
    second = call(script, tmp_path, "b", check_env=True)
    assert first["returncode"] == second["returncode"] == 0 and not first["timed_out"]
    assert first["ppid"] == second["ppid"] == server and first["pid"] != second["pid"]
    # preloaded once; nothing the first request changed (module state, environment) reached the second
    assert first["state"] == second["state"] == {"preloaded": 1, "runs": 1}
    assert second["leaked_before"] is None and "LEAKED" not in os.environ
    assert Path(second["cwd"]).name.startswith("b-") and second["stdin"] == ""
    assert "output of b" in second["stderr_tail"] and "output of a" not in second["stderr_tail"]


def test_a_crash_reports_the_signal_and_the_next_request_gets_a_fresh_child(script, tmp_path):
    call(script, tmp_path, "a")
    server = warm.pid_of(str(script))
    assert server is not None
    crashed = call(script, tmp_path, "b", crash=True)
    assert crashed["returncode"] == -11 and crashed["pid"] and not crashed["timed_out"]
    assert warm.pid_of(str(script)) is None and warm.live_members(server) == []
    after = call(script, tmp_path, "c")
    assert after["returncode"] == 0 and after["ppid"] not in (None, server)


def test_a_request_past_its_bound_is_killed_with_its_group(script, tmp_path):
    call(script, tmp_path, "a")
    server = warm.pid_of(str(script))
    assert server is not None
    slow = call(script, tmp_path, "b", timeout=1.0, sleep=60)
    assert slow["timed_out"] and slow["returncode"] < 0 and slow["seconds"] < 10
    assert warm.pid_of(str(script)) is None and warm.live_members(server) == []
    assert call(script, tmp_path, "c")["returncode"] == 0


def test_a_preload_that_starts_a_thread_is_not_forked_from(script, tmp_path):
    for name in ("a", "b"):
        result = call(script, tmp_path, name, key={"start_a_thread": True})
        assert result["returncode"] == 0 and result["state"]["preloaded"] == -1  # one-shot children
    assert warm.pid_of(str(script)) is None


def test_another_key_replaces_the_warm_child(script, tmp_path):
    call(script, tmp_path, "a", key={"tp_size": 1})
    first = warm.pid_of(str(script))
    call(script, tmp_path, "b", key={"tp_size": 2})
    second = warm.pid_of(str(script))
    assert None not in (first, second) and first != second and warm.live_members(first or 0) == []
