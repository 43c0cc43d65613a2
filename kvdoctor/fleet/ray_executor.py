"""`check --executor ray`: each target is one Ray task, for dry runs of a whole model registry.

Ray does the scheduling and the resource accounting: a task asks for what its check needs (a dry
run one CPU and the memory its schedule is bounded by; a check without caches a fraction of a CPU),
so a cluster runs as many at once as its nodes hold. Results are collected in input order as they
finish, from the same `check_one` a local run calls, so the output is the local run's. A task whose
worker dies (killed, out of memory, node lost) is retried once by Ray; if it dies again the target
gets an error of its own and the other targets are still reported: none is ever dropped.
"""
from __future__ import annotations

import os
from typing import Any, Callable

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
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": env} if env else None)
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
