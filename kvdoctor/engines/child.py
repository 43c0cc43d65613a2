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
WARM_RSS_BOUND = 2 << 30  # a warm child (its requests run in forks) that grew past this after one retires


def venvs_dir() -> Path:
    """Where the engines' own venvs are (`kvdoctor engines install` builds them there):
    $KVDOCTOR_ENGINE_VENVS, else this checkout's goldens/.venv (the goldens' venvs, goldens/README.md),
    else kvdoctor's folder in the user's data directory for an installed kvdoctor."""
    if os.environ.get("KVDOCTOR_ENGINE_VENVS"):
        return Path(os.environ["KVDOCTOR_ENGINE_VENVS"])
    if (REPO / "goldens").is_dir() and (REPO / "pyproject.toml").is_file():
        return REPO / "goldens" / ".venv"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "kvdoctor" / "venvs"


def find_python(explicit: str | None, env_var: str, venv: str) -> Path | None:
    """The engine's Python: --engine-python, else $ENV_VAR, else venvs_dir()/VENV. Made absolute (the child
    runs in another directory), not resolved: a venv's python is a link its venv is found through."""
    for candidate in (explicit, os.environ.get(env_var), venvs_dir() / venv / "bin" / "python"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(os.path.abspath(candidate))
    return None


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_child(python: Path, script: Path, folder: Path, request: Mapping[str, Any], env: Mapping[str, str],
              timeout: float, warm_key: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run `python -P script REQUEST RESULT` in `folder` with `env` added to ours; the child's result with
    `timed_out`, `returncode`, `seconds` and `stderr_tail`.

    With `warm_key`, the script runs in this process's warm child for (python, script, env, warm_key)
    where one can serve (kvdoctor/engines/warm.py): the script's `preload(warm_key)` has imported what
    every request needs once, and each request runs its `main()` in a fork. The caller promises that
    requests with equal keys need the same preload."""
    req, out = folder / "request.json", folder / "result.json"
    req.write_text(json.dumps(request))
    started = time.monotonic()
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **env}
    result: dict[str, Any] | None = None
    if warm_key is not None:
        result = _run_warm(python, script, folder, full_env, dict(env), dict(warm_key), timeout)
    if result is None:
        result = _run_one_shot(python, script, folder, full_env, max(0.0, started + timeout - time.monotonic()))
    result["seconds"] = round(time.monotonic() - started, 2)
    if out.exists() and out.read_text():
        result.update(json.loads(out.read_text()))
    return result


def _run_one_shot(python: Path, script: Path, folder: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    req, out, err = folder / "request.json", folder / "result.json", folder / "stderr.txt"
    result: dict[str, Any] = {"timed_out": False}
    with open(err, "w+") as stderr:
        proc = subprocess.Popen([str(python), "-P", str(script), str(req), str(out)], stdin=subprocess.DEVNULL,
                                stdout=stderr, stderr=stderr, env=env, cwd=folder, start_new_session=True,
                                preexec_fn=_limit_memory)
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
    return result


def _run_warm(python: Path, script: Path, folder: Path, env: dict[str, str], extra_env: dict[str, str],
              key: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    from kvdoctor.engines import warm

    if not warm.available():
        return None
    req, out, err = folder / "request.json", folder / "result.json", folder / "stderr.txt"
    argv = [str(python), "-P", str(warm.SERVER), str(script), "--key", json.dumps(key)]
    ran = warm.run(str(script), {"python": str(python), "env": extra_env, "key": key}, argv, env,
                   {"argv": [str(req), str(out)], "cwd": str(folder)}, err, timeout, WARM_RSS_BOUND,
                   preexec_fn=_limit_memory)
    if ran is None:
        return None
    if ran.timed_out:  # as a one-shot child's, killed at the bound
        return {"timed_out": True, "returncode": -signal.SIGKILL, "stderr_tail": ran.stderr[-STDERR_TAIL:]}
    return {"timed_out": False, "returncode": ran.returncode, "stderr_tail": ran.stderr[-STDERR_TAIL:]}
