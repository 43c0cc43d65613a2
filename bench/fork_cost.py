"""What a forked -j worker pays that the process it was forked from does not: copy-on-write.

A worker is forked once the parent has imported every check and built the work list; the pages it
then writes (reference counts, in the parent's heap and in libpython's own data) are copied first.
This prints, per fresh interpreter, the first and second pass over a fleet's work list in a process
forked from the one that prepared it, against the same passes in that process itself (another fresh
interpreter, so both start alike): wall and CPU time and minor page faults of each pass, and by
mapping (/proc/self/smaps) how much memory the first pass made private: in the preparing process only
what it newly allocated, in the forked one also the pages it copied.

Usage: `python bench/fork_cost.py ROUNDS FLEET_DIR`, e.g. `python bench/fork_cost.py 5 bench/out/fleet-100`.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepared_work(fleet: str) -> tuple[list, object]:
    """The work list and renderer a `check FLEET --static --format json -j 2` run hands its workers,
    taken where run_check passes them to the runner, after the runner's warm-up imports."""
    sys.path.insert(0, ROOT)
    from kvdoctor.cli import collector

    collector.pause()
    import kvdoctor.fleet.runner as runner
    from kvdoctor.cli.check import CheckRequest, run_check

    taken: dict = {}

    def take(work, jobs, on_done=None, render=None):
        taken["work"], taken["render"] = work, render
        return [], [], None

    runner.run_targets = take
    run_check(CheckRequest(targets=[fleet], static=True, output_format="json", quiet=True, output_file=os.devnull))
    runner.warm_imports(taken["work"])
    collector.resume()  # freezes what is loaded, as the -j parent has by its fork
    return taken["work"], taken["render"]


MAPPINGS = ("[heap]", "anonymous", "libpython", "other")  # malloc's heap, obmalloc's arenas and large blocks


def private_kb() -> dict[str, int]:
    """Private_Dirty kilobytes of this process by kind of mapping."""
    out = dict.fromkeys(MAPPINGS, 0)
    kind = "other"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields[0].endswith(":"):
                if fields[0] == "Private_Dirty:":
                    out[kind] += int(fields[1])
                continue
            name = fields[5] if len(fields) > 5 else ""  # a mapping's first line: range, perms, ..., path
            kind = ("anonymous" if not name else name if name == "[heap]"
                    else "libpython" if "libpython" in name else "other")
    return out


def one_pass(work: list, render) -> tuple[float, float, int, dict[str, int]]:
    from kvdoctor.fleet.runner import _checked

    private = private_kb()  # read outside the timed pass: reading smaps faults pages of its own
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu = time.perf_counter(), time.process_time()
    for target, opts in work:
        _checked(target, opts, render)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return wall, cpu, faults, {kind: kb - private[kind] for kind, kb in private_kb().items()}


def measure(fleet: str, forked: bool) -> None:
    """One interpreter's figures, printed as one line: first pass, then second pass."""
    work, render = prepared_work(fleet)
    if forked:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, json.dumps([one_pass(work, render), one_pass(work, render)]).encode())
            os._exit(0)
        os.close(write)
        print(os.read(read, 4096).decode())
        os.waitpid(pid, 0)
    else:
        print(json.dumps([one_pass(work, render), one_pass(work, render)]))


def main() -> None:
    if sys.argv[1] == "--measure":
        measure(sys.argv[3], sys.argv[2] == "forked")
        return
    rounds, fleet = int(sys.argv[1]), sys.argv[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    samples: dict[str, list] = {"preparing process": [], "forked from it": []}
    for _ in range(rounds):  # interleaved, so that the box's load hits both alike
        for label, how in (("preparing process", "own"), ("forked from it", "forked")):
            out = subprocess.run([sys.executable, __file__, "--measure", how, fleet], capture_output=True, text=True,
                                 env=env, check=True).stdout
            samples[label].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'':18} {'pass':>6} {'wall ms':>8} {'CPU ms':>7} {'faults':>7}   (median of {rounds})")
    for label, rows in samples.items():
        for n, name in enumerate(("first", "second")):
            wall, cpu, faults = (statistics.median(row[n][k] for row in rows) for k in range(3))
            print(f"{label:18} {name:>6} {wall * 1e3:8.1f} {cpu * 1e3:7.1f} {faults:7.0f}")
    print(f"\nmade private by the first pass, KB (median of {rounds})")
    print(f"{'':18} " + " ".join(f"{kind:>10}" for kind in MAPPINGS))
    for label, rows in samples.items():
        print(f"{label:18} " + " ".join(f"{statistics.median(row[0][3][kind] for row in rows):10.0f}" for kind in MAPPINGS))


if __name__ == "__main__":
    main()
