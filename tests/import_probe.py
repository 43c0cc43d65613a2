"""Which modules one kvdoctor command line imports: the CLI run in a fresh interpreter, then its
`sys.modules` read. Shared by the tests that keep the light paths light."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """
import gc, json, sys
watch = set(json.loads(sys.argv[1]))
sys.argv = ["kvdoctor", *sys.argv[2:]]
from kvdoctor.cli.main import main
collections = []  # at each collection from here on: the watched modules loaded by then
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(sorted(set(sys.modules) & watch)))
try:
    main()
except SystemExit:
    pass
names = set(sys.modules) | {name.split(".")[0] for name in sys.modules}
print("LOADED:" + json.dumps([sorted(names & watch), gc.isenabled(), gc.get_freeze_count(), collections]),
      file=sys.stderr)
"""

# What `kvdoctor budget` imports and `--help` / `check --static` must not: each engine's sizing model
# and the budget run over them.
SIZING = ("kvdoctor.engines.budget.run", "kvdoctor.engines.vllm.budget", "kvdoctor.engines.sglang.budget",
          "kvdoctor.engines.mlx_lm.budget")


@dataclass
class Probed:
    returncode: int
    stdout: str
    stderr: str
    loaded: set[str]  # the watched names (top-level packages or whole module names) that were imported
    collector_on: bool  # the cyclic garbage collector, after the command
    frozen: int  # objects gc.freeze() left out of the collector's passes
    collections: list[list[str]]  # at each collection the command's collector ran: the watched modules loaded by then


def probe(args: list[str], watch: tuple[str, ...], cwd: Path | None = None, input: str | None = None) -> Probed:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(watch), *args], capture_output=True, text=True,
                          cwd=cwd, input=input, timeout=600)
    last = proc.stderr.strip().splitlines()[-1:] or [""]
    assert last[0].startswith("LOADED:"), proc.stderr[-2000:]  # the CLI returned and the probe reported
    names, collector_on, frozen, collections = json.loads(last[0][len("LOADED:"):])
    return Probed(proc.returncode, proc.stdout, proc.stderr, set(names), collector_on, frozen, collections)
