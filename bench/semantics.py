"""Benchmark: what `check --static` costs by where a model's semantics come from.

Times cold `kvdoctor check --static --format json` processes on config-only directories built from
the real-config corpus, interleaved round by round:

  table         a family in kvdoctor's own table (DeepSeek-V3): transformers is never imported
  transformers  a type only transformers knows (Mixtral, MiniMax-M2.5): its configuration registry
                is imported (and torch with it), once per process
  guess         a type neither knows (MiMo): the best-effort spec, transformers imported to ask

Each figure is the median over --runs with the min..max spread, and the median CPU time (user +
system) of the process, which a loaded machine disturbs less. Usage:
`python bench/semantics.py [--runs N] [--json FILE]`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fixtures" / "configs" / "real"
CASES = {"table": "deepseek-ai__DeepSeek-V3", "transformers": "mistralai__Mixtral-8x7B-v0.1",
         "transformers-hybrid": "MiniMaxAI__MiniMax-M2.5", "guess": "XiaomiMiMo__MiMo-7B-Base"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for label, name in CASES.items():
            d = Path(tmp) / name
            d.mkdir()
            shutil.copyfile(CORPUS / f"{name}.json", d / "config.json")
            dirs[label] = d
        times: dict[str, list[float]] = {label: [] for label in CASES}
        cpu: dict[str, list[float]] = {label: [] for label in CASES}
        for _ in range(args.runs):
            for label, d in dirs.items():
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "kvdoctor", "check", "--static", "--format", "json",
                                       str(d)], capture_output=True, text=True, env=env)
                times[label].append(time.perf_counter() - start)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[label].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                if proc.returncode not in (0, 1):
                    raise SystemExit(f"{label}: exit {proc.returncode}: {proc.stderr.strip()}")
    rows = {label: {"model": CASES[label], "median_s": round(statistics.median(t), 2),
                    "min_s": round(min(t), 2), "max_s": round(max(t), 2), "cpu_median_s": round(statistics.median(cpu[label]), 2),
                    "runs": len(t), "load_average": round(os.getloadavg()[0], 1)}
            for label, t in times.items()}
    for label, row in rows.items():
        print(f"{label:20} {row['model']:32} wall median {row['median_s']:.2f} s ({row['min_s']:.2f}..{row['max_s']:.2f}), "
              f"cpu {row['cpu_median_s']:.2f} s, load {row['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
