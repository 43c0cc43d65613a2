"""When each process of a fleet run reaches each step, against `1+1`: clock marks (milliseconds since
the launch, wall and the process's own CPU) in cold runs of `check FOLDER --static --format json
-j 2` and of two `-j 1` processes started together on half the fleet each (`bench/run.py:halves`).

Marks: `loaded` (kvdoctor's modules imported and the command line read), `first check` (the first
target's check starts in that process), `fork` and `exit` (a -j worker's life), `checks done` (the
parent has every result), `emitted` (the report is written), and `end` (the launcher has reaped the
process). A worker's wall time minus its CPU is the time it waited (for a batch, for the parent to
drain its answer, or for a core).

Usage: `python bench/fleet_marks.py [ROUNDS] [FOLDER]` (defaults: 15, bench/out/fleet-100; run
`bench/run.py --only fleet` once first to build the fleet). Rounds interleave the two.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import env, halves  # noqa: E402

# kvdoctor in-process, with a mark written to stderr at each step (forked workers inherit the hooks).
WRAPPER = r"""
import os, sys, time
launched = int(os.environ["KVD_MARKS_T0"])
def mark(name):
    os.write(2, f"MARK {os.getpid()} {name} {(time.monotonic_ns() - launched) / 1e6} {time.process_time() * 1e3}\n".encode())
import kvdoctor.cli.check as command
import kvdoctor.fleet.runner as runner
def wrap(owner, name, before=None, after=None):
    inner = getattr(owner, name)
    def hooked(*args, **kwargs):
        if before: mark(before)
        result = inner(*args, **kwargs)
        if after: mark(after)
        return result
    setattr(owner, name, hooked)
wrap(command, "run_check", before="loaded")
wrap(command, "emit", after="emitted")
wrap(runner, "run_with_progress", after="checks done")
checked, seen = runner._checked, set()
def first(*args):
    if os.getpid() not in seen:
        seen.add(os.getpid())
        mark("first check")
    return checked(*args)
runner._checked = first
fork, leave = os.fork, os._exit
def forked():
    pid = fork()
    if pid == 0:
        mark("fork")
    return pid
def left(code):
    mark("exit")
    leave(code)
os.fork, os._exit = forked, left
sys.argv = ["kvdoctor", *sys.argv[1:]]
import kvdoctor.cli.main
kvdoctor.cli.main.entry()
"""

ARGS = ["--static", "--format", "json"]


def launch(commands: list[list[str]]) -> dict[str, tuple[float, float]]:
    """Start the commands together; each process's marks, named by role (p, w1, w2 for one -j 2
    command; a, b for two commands) and step, with the launcher's `end`."""
    launched = time.monotonic_ns()
    logs = [tempfile.TemporaryFile() for _ in commands]
    procs = [subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-c", WRAPPER, *cmd], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=log,
                              env={**env(), "KVD_MARKS_T0": str(launched)}) for cmd, log in zip(commands, logs)]
    for proc in procs:
        proc.wait()
    end = (time.monotonic_ns() - launched) / 1e6
    marks: dict[str, tuple[float, float]] = {"end": (end, float("nan"))}
    for n, log in enumerate(logs):
        log.seek(0)
        roles: dict[str, str] = {}
        for line in log.read().decode().splitlines():
            if not line.startswith("MARK "):
                continue
            _, pid, rest = line.split(" ", 2)
            step, wall, cpu = rest.rsplit(" ", 2)
            if len(commands) > 1:
                role = "ab"[n]
            else:
                role = roles.setdefault(pid, "p" if not roles else f"w{len(roles)}")
            marks[f"{role}: {step}"] = (float(wall), float(cpu))
    return marks


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    folder = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "bench" / "out" / "fleet-100"
    half_a, half_b = halves(folder)
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"-j 2": [], "1+1": []}
    for _ in range(rounds):
        runs["-j 2"].append(launch([["check", str(folder), *ARGS, "-j", "2"]]))
        runs["1+1"].append(launch([["check", *half_a, *ARGS, "-j", "1"], ["check", *half_b, *ARGS, "-j", "1"]]))
    for name, samples in runs.items():
        steps: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for sample in samples:
            for step, value in sample.items():
                steps[step].append(value)
        print(f"{name} ({folder.name}, median of {rounds})   wall ms   CPU ms")
        for step, values in sorted(steps.items(), key=lambda kv: statistics.median(v[0] for v in kv[1])):
            wall = statistics.median(v[0] for v in values)
            cpu = statistics.median(v[1] for v in values)
            print(f"  {step:18} {wall:9.1f} {'' if cpu != cpu else f'{cpu:8.1f}'}")
        print()


if __name__ == "__main__":
    main()
