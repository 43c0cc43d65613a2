"""Benchmark `kvdoctor triage` on 20,000-line logs, against another commit's kvdoctor on the same box.

Logs (written once under a temp folder, deterministic):

  prose     unprefixed sentences from a fixed vocabulary of serving words: every line continues the
            one before, so every line opens wrapped-line windows (the worst case for them)
  docs      kvdoctor's own docs/*.md paragraphs over and over: unprefixed prose that quotes catalog
            messages, so some windows do hold catalog text
  server    a vLLM server log (prefixed INFO lines) that ends in a traceback and a catalog error

Each figure is the CPU time of `triage_file` in a fresh process (imports and the catalog loaded before
the clock starts), median of --runs, the two kvdoctors interleaved run by run so the shared box's load
hits both alike. `--baseline REF` (default HEAD~1) is read with `git archive` into a temp folder.

Usage: `python bench/triage.py [--runs N] [--baseline REF] [--json FILE]`; prints a table and writes
bench/results/triage.json.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LINES = 20_000
WORDS = ("the cache server model request token block memory layer pool engine batch sequence prefix window "
         "attention decode prefill allocate free kernel worker scheduler config value error was is a of to "
         "in for with on that this it when after before not more than each every user prompt reply context "
         "length limit size page state group spec graph capture stream").split()

TIMER = r"""
import sys, time
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.triage import prepared, triage_file
catalog = builtin_catalog()
prepared(catalog)
start = time.process_time()
report = triage_file(sys.argv[1], catalog)
print(time.process_time() - start, len(report.hits))
"""


def write_logs(folder: Path) -> dict[str, Path]:
    rng = random.Random(7)
    prose = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
             for _ in range(LINES)]
    paragraphs = [line.rstrip() for doc in sorted((ROOT / "docs").glob("*.md"))
                  for line in doc.read_text().splitlines() if line.strip() and not line.startswith("|")]
    docs = (paragraphs * (LINES // len(paragraphs) + 1))[:LINES]
    server = [f"INFO 06-15 08:{i // 600 % 60:02d}:{i // 10 % 60:02d} [loggers.py:{i % 300}] Engine 000: Avg prompt "
              f"throughput: {i % 97}.0 tokens/s, Running: {i % 7} reqs, GPU KV cache usage: {i % 100}.0%"
              for i in range(LINES - 4)]
    server += ["Traceback (most recent call last):",
               '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", line 703, in check',
               "    raise ValueError(",
               "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
               "when initializing the engine."]
    logs = {"prose": prose, "docs": docs, "server": server}
    paths = {}
    for name, lines in logs.items():
        paths[name] = folder / f"{name}.log"
        paths[name].write_text("\n".join(lines) + "\n")
    return paths


def checkout(ref: str, folder: Path) -> Path:
    """kvdoctor and rules/ as they are at `ref`, unpacked into `folder`."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "kvdoctor", "rules"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def cpu_seconds(tree: Path, log: Path) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", TIMER, str(log)], check=True, capture_output=True, text=True,
                         cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default="HEAD~1")
    parser.add_argument("--json", default=str(HERE / "results" / "triage.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = write_logs(Path(tmp))
        trees = {"this": ROOT, args.baseline: checkout(args.baseline, Path(tmp) / "baseline")}
        times: dict[str, dict[str, list[float]]] = {name: {t: [] for t in trees} for name in logs}
        hits: dict[str, dict[str, int]] = {name: {} for name in logs}
        for _ in range(args.runs):
            for name, log in logs.items():
                for tree_name, tree in trees.items():
                    seconds, found = cpu_seconds(tree, log)
                    times[name][tree_name].append(seconds)
                    hits[name][tree_name] = found
    rows = {name: {t: {"median": statistics.median(v), "min": min(v), "max": max(v), "hits": hits[name][t]}
                   for t, v in per_tree.items()} for name, per_tree in times.items()}
    print(f"{'log':8} {'kvdoctor':10} {'median':>8} {'min':>8} {'max':>8} {'entries':>8}")
    for name, per_tree in rows.items():
        for tree_name, r in per_tree.items():
            print(f"{name:8} {tree_name:10} {r['median']:8.2f} {r['min']:8.2f} {r['max']:8.2f} {r['hits']:8d}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"lines": LINES, "runs": args.runs, "baseline": args.baseline,
                                           "cpu_seconds": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
