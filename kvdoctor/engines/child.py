"""One engine script run in a child process of another Python (the engine's own venv), as the vLLM and
SGLang-CUDA dry runs do: a request file in, a result file out, a time bound, an address-space cap.

The child leads its own session, so the time bound kills it and everything it started; its output goes
to a file whose tail is kept for the report.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "goldens" / "stubs"  # stand-ins for packages an engine imports but a CPU box cannot load
ADDRESS_SPACE = 64 << 30  # torch reserves far more address space than it touches; 64 GiB leaves room
STDERR_TAIL = 2000


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_child(python: Path, script: Path, folder: Path, request: Mapping[str, Any], env: Mapping[str, str],
              timeout: float) -> dict[str, Any]:
    """Run `python -P script REQUEST RESULT` in `folder` with `env` added to ours; the child's result with
    `timed_out`, `returncode`, `seconds` and `stderr_tail`."""
    req, out, err = folder / "request.json", folder / "result.json", folder / "stderr.txt"
    req.write_text(json.dumps(request))
    started = time.monotonic()
    result: dict[str, Any] = {"timed_out": False}
    with open(err, "w+") as stderr:
        proc = subprocess.Popen([str(python), "-P", str(script), str(req), str(out)], stdin=subprocess.DEVNULL,
                                stdout=stderr, stderr=stderr, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                                                   "PYTHONUNBUFFERED": "1", **env},
                                cwd=folder, start_new_session=True, preexec_fn=_limit_memory)
        try:
            result["returncode"] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            result["timed_out"] = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            result["returncode"] = proc.wait()
        stderr.seek(0)
        result["stderr_tail"] = stderr.read()[-STDERR_TAIL:]
    result["seconds"] = round(time.monotonic() - started, 2)
    if out.exists() and out.read_text():
        result.update(json.loads(out.read_text()))
    return result
