"""`check --executor ray`: each target is one Ray task, for dry runs of a whole model registry.

Ray does the scheduling and the resource accounting: a task asks for what its check needs (a dry
run one CPU and the memory its schedule is bounded by; a check without caches a fraction of a CPU),
so a cluster runs as many at once as its nodes hold. Results are collected in input order as they
finish, from the same `check_one` a local run calls, so the output is the local run's. A task whose
worker dies (killed, out of memory, node lost) is retried once by Ray; if it dies again the target
gets an error of its own and the other targets are still reported: none is ever dropped.

A cluster that cannot be joined is the user's setting, not kvdoctor's bug: no head at the address, a
head that wants an authentication token (Ray 2.60 heads turn token authentication on by default) or
one running another Ray or Python is one line with the fix, exit 2.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from kvdoctor.pipeline.check import Options
from kvdoctor.errors import InputError
from kvdoctor.model import Result
from kvdoctor.fleet.runner import check_one, died

RETRIES = 1
STATIC_CPUS = 0.25
STATIC_MEMORY = 256 * 1024**2
CHECK_MEMORY = 1024**3  # a full check: the probe caches are bounded by limits.py's budget
DRY_RUN_CPUS = 1.0
DRY_RUN_MEMORY = 2 * 1024**3  # the dry run's measured peak (docs/performance.md), its schedule's bound
# What a worker of a Ray started here takes from this process's environment.
RAY_ENV = ("PYTHONPATH", "HF_ENDPOINT", "HF_TOKEN", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "KVDOCTOR_HUB_CACHE")


def resources(opts: Options) -> dict[str, Any]:
    """The CPUs and memory a task asks Ray for, by what the check will run."""
    if opts.extra.get("dry_run"):
        return {"num_cpus": DRY_RUN_CPUS, "memory": DRY_RUN_MEMORY}
    if opts.static:
        return {"num_cpus": STATIC_CPUS, "memory": STATIC_MEMORY}
    return {"num_cpus": 1.0, "memory": CHECK_MEMORY}


def _in_dir(cwd: str, task: Callable[[str, Options], tuple[Result, str | None]], target: str,
            opts: Options) -> tuple[Result, str | None]:
    """Run `task` from the caller's working directory: relative targets and deploy files mean what
    they meant on the command line (a cluster's nodes share the models' file system)."""
    os.chdir(cwd)
    return task(target, opts)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray, which is not installed: pip install 'kvdoctor[ray]'") from None
    return ray


CONNECT_SECONDS = 3.0  # a head on the address accepts a TCP connection within this
JOIN_TRIES = "3"  # RAY_gcs_server_port_wait_time_s while joining: Ray's default retries for 20 s
TOKEN_HELP = ("RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (`ray get-auth-token` on the head "
              "prints it)")


def _reachable(address: str) -> None:
    """InputError when nothing accepts a connection at HOST:PORT (other forms are left to Ray)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise InputError(f"no Ray cluster answers at {address} ({why}): start one with `ray start --head "
                         f"--port {port}`, or pass its head's address (--ray-address HOST:PORT or RAY_ADDRESS)") from None


def join_error(address: str, exc: BaseException) -> InputError | None:
    """The one line for a failure to join the cluster at `address`, from Ray's exception chain; None when
    the failure is none of the user's settings kvdoctor knows."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 8:
        texts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    text = "\n".join(texts)
    if "InvalidAuthToken" in text or "AuthenticationError" in text:
        if "no authentication token was found" in text:
            return InputError(f"the Ray cluster at {address} requires token authentication and no token was found: "
                              f"give the cluster's token in {TOKEN_HELP}")
        if os.environ.get("RAY_AUTH_MODE") != "token":
            return InputError(f"the Ray cluster at {address} requires token authentication: set RAY_AUTH_MODE=token "
                              f"and give the cluster's token in {TOKEN_HELP}")
        return InputError(f"the Ray cluster at {address} refused this process's token: give the cluster's token in "
                          f"{TOKEN_HELP}")
    mismatch = re.search(r"Version mismatch: The cluster was started with:\s*Ray: (\S+)\s*Python: (\S+)\s*"
                         r"This process.*?with:\s*Ray: (\S+)\s*Python: (\S+)", text, re.S)
    if mismatch:
        ray_c, py_c, ray_here, py_here = mismatch.groups()
        return InputError(f"the Ray cluster at {address} runs Ray {ray_c} on Python {py_c}, this process Ray {ray_here} "
                          f"on Python {py_here}: run kvdoctor where ray=={ray_c} and Python {py_c} are installed")
    return None


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Hold what Ray's C++ core writes to stderr while joining (a warning per retry); write it out
    unless the join fails, when the one-line error says what went wrong."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))


def _join(ray: Any, address: str, **kwargs: Any) -> None:
    """ray.init on an existing cluster, with its failures as one line."""
    _reachable(address)
    previous = os.environ.get("RAY_gcs_server_port_wait_time_s")
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", JOIN_TRIES)
    try:
        with _quiet_stderr():
            ray.init(address=address, **kwargs)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError or its AuthenticationError
        error = join_error(address, exc)
        if error is None:
            raise
        raise error from None
    finally:
        if previous is None:
            os.environ.pop("RAY_gcs_server_port_wait_time_s", None)


def run_on_ray(work: list[tuple[str, Options]], address: str | None = None,
               task: Callable[[str, Options], tuple[Result, str | None]] = check_one,
               on_done: Callable[[int, Result], None] | None = None) -> tuple[list[Result], list[str]]:
    """Check each (target, options) pair as a Ray task; results in input order, plus any tracebacks.

    `address` joins a running cluster (else RAY_ADDRESS, else Ray starts a local one for the run
    and stops it at the end)."""
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        # Workers import the same kvdoctor as this process and read a Hub as it would.
        env = {name: os.environ[name] for name in RAY_ENV if name in os.environ}
        options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                       runtime_env={"env_vars": env} if env else None)
        address = address or os.environ.get("RAY_ADDRESS")
        if address in (None, "local", "auto"):
            ray.init(address=address, **options)
        else:
            _join(ray, address, **options)
    try:
        remote = ray.remote(max_retries=RETRIES, retry_exceptions=False)(_in_dir)
        cwd = os.getcwd()
        refs = [remote.options(**resources(opts)).remote(cwd, task, target, opts) for target, opts in work]
        results: list[Result] = []
        tracebacks: list[str] = []
        for i, ((target, opts), ref) in enumerate(zip(work, refs)):  # input order; later tasks run meanwhile
            try:
                result, text = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the task's worker died twice (Ray raises its own errors)
                result, text = died(target, opts, f"{type(exc).__name__} after {RETRIES} retry"), None
            results.append(result)
            if text:
                tracebacks.append(text)
            if on_done:
                on_done(i, result)
        return results, tracebacks
    finally:
        if started_here:
            ray.shutdown()
