"""Whether a fleet's workers pay for the fork or for running side by side: the same static checks,
after the same imports, timed (CPU seconds) in this process, in one forked child, and split between
two forked children running at once. Rounds interleave the three.

Usage: `python bench/contention.py [ROUNDS] [FOLDER]` (defaults: 4, bench/out/fleet-100; run
`bench/run.py --only fleet` once first to build the fleet).
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvdoctor.cli import collector  # noqa: E402

collector.pause()
from kvdoctor.catalog import builtin_catalog  # noqa: E402
from kvdoctor.pipeline.check import Options  # noqa: E402
from kvdoctor.cli.check import json_part  # noqa: E402
from kvdoctor.fleet.runner import _checked, expand_targets, warm_imports  # noqa: E402


def cpu_of(work: list, render) -> float:
    start = time.process_time()
    for target, opts in work:
        _checked(target, opts, render)
    return time.process_time() - start


def in_children(parts: list[list], render) -> float:
    """The CPU seconds the children spent, each checking its part, all running at once."""
    pipes = []
    for part in parts:
        read, write = os.pipe()
        if os.fork() == 0:
            os.write(write, repr(cpu_of(part, render)).encode())
            os._exit(0)
        os.close(write)
        pipes.append(read)
    for _ in parts:
        os.wait()
    return sum(float(os.read(read, 64)) for read in pipes)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    folder = sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "bench" / "out" / "fleet-100")
    opts = Options(catalog=builtin_catalog(), static=True)
    work = [(target, opts) for target in expand_targets([folder])]
    warm_imports(work)
    cpu_of(work[:1], None)  # anything loaded on first use is loaded before the fork
    collector.resume()
    gc.freeze()
    render = partial(json_part, ROOT)
    rows: dict[str, list[float]] = {"this process": [], "one forked child": [], "two children at once": []}
    for _ in range(rounds):
        rows["this process"].append(cpu_of(work, render))
        rows["one forked child"].append(in_children([work], render))
        rows["two children at once"].append(in_children([work[0::2], work[1::2]], render))
    print(f"{len(work)} static checks, CPU seconds over {rounds} rounds:")
    for name, values in rows.items():
        print(f"  {name:22} median {statistics.median(values):.3f}  least {min(values):.3f}  most {max(values):.3f}")


if __name__ == "__main__":
    main()
