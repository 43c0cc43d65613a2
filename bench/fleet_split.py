"""Where a fleet's time goes at -j 1 and -j 2: the parent's CPU, the workers' CPU, and the parent's
CPU inside run_targets, per cold run, for one or more checkouts interleaved round by round.

On a shared box wall-clock figures follow the neighbours' load; CPU seconds follow it much less, so
this also prints a 2-core estimate from them: the parent's CPU outside run_targets is serial, the
workers' CPU and the parent's inside run_targets share the two cores.

Usage: `python bench/fleet_split.py RUNS CHECKOUT... -- ARGS`, e.g.
`python bench/fleet_split.py 9 . -- check bench/out/fleet-100 --static --format json`
(ARGS without -j; each checkout runs its own kvdoctor, from its own directory, with its own .venv).
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

# Runs kvdoctor in-process and, at exit, reports its own CPU, its workers' (waited-for children) and
# its CPU inside run_targets (forked workers leave through os._exit, so this runs in the parent only).
WRAPPER = r"""
import atexit, os, resource, sys, time
sys.path.insert(0, os.getcwd())
import kvdoctor.fleet.runner as runner
inside = [0.0]
run_targets = runner.run_targets
def timed(*args, **kwargs):
    start = time.process_time()
    try:
        return run_targets(*args, **kwargs)
    finally:
        inside[0] += time.process_time() - start
runner.run_targets = timed
def report():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    os.write(2, f"SPLIT {own.ru_utime + own.ru_stime} {kids.ru_utime + kids.ru_stime} {inside[0]}\n".encode())
atexit.register(report)
sys.argv = ["kvdoctor", *sys.argv[1:]]
import runpy
runpy.run_module("kvdoctor", run_name="__main__")
"""


def one(checkout: str, args: list[str], jobs: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    proc = subprocess.Popen([os.path.join(checkout, ".venv", "bin", "python"), "-c", WRAPPER, *args, "-j", str(jobs)],
                            cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode() if proc.stderr else ""
    _, _, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    match = re.search(r"SPLIT (\S+) (\S+) (\S+)", err)
    if match is None:
        raise SystemExit(f"{checkout}: no figures from the run:\n{err[-2000:]}")
    parent, workers, inside = map(float, match.groups())
    estimate = parent if jobs == 1 else parent - inside + (workers + inside) / 2
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "parent": parent, "workers": workers,
            "inside": inside, "estimate": estimate}


def main() -> None:
    split = sys.argv.index("--")
    runs, checkouts, args = int(sys.argv[1]), sys.argv[2:split], sys.argv[split + 1:]
    samples: dict[tuple[str, int], list[dict[str, float]]] = {(c, j): [] for c in checkouts for j in (1, 2)}
    for _ in range(runs):
        for checkout in checkouts:
            for jobs in (1, 2):
                samples[(checkout, jobs)].append(one(checkout, args, jobs))
    print(f"{'checkout':24} -j  {'wall min':>8} {'median':>7} {'CPU min':>7} {'parent':>7} {'workers':>7} "
          f"{'inside':>7} {'2-core estimate':>15}")
    for checkout in checkouts:
        for jobs in (1, 2):
            rows = samples[(checkout, jobs)]
            least = {key: min(row[key] for row in rows) for key in rows[0]}
            print(f"{checkout[-24:]:24} {jobs:>2}  {least['wall']:>8.3f} {statistics.median(r['wall'] for r in rows):>7.3f} "
                  f"{least['cpu']:>7.3f} {least['parent']:>7.3f} {least['workers']:>7.3f} {least['inside']:>7.3f} "
                  f"{least['estimate']:>15.3f}")
        one_job, two_jobs = samples[(checkout, 1)], samples[(checkout, 2)]
        paired = statistics.median(a["wall"] / b["wall"] for a, b in zip(one_job, two_jobs))
        least_wall = min(r["wall"] for r in one_job) / min(r["wall"] for r in two_jobs)
        least_estimate = min(r["estimate"] for r in one_job) / min(r["estimate"] for r in two_jobs)
        print(f"{'':24} -j 1 / -j 2: wall least/least {least_wall:.2f}, paired median {paired:.2f}; "
              f"estimate least/least {least_estimate:.2f}")


if __name__ == "__main__":
    main()
