"""`kvdoctor fit` of a 21,128-tensor checkpoint (Kimi Linear 48B in 20 sparse shards, the real tensor names and
shapes; see bench/hub.py): a cold process per run, 8 H100s (its 4 layouts of 8 GPUs, then the recommendation
over 1, 2 and 4), 128k context, 16 requests; and the same in-process (`kvdoctor.api.fit`, imports warm).

The cold process runs with Python's bytecode cache on, as an installed kvdoctor has it (pip compiles the
package when it installs it): one run first writes the cache, then the timed runs. With PYTHONDONTWRITEBYTECODE
set, as in the agents' shells, every run would compile kvdoctor's 60-odd modules again (0.2-0.3 s here), which
no user pays.

Usage: `python bench/fit.py [--runs N] [--json FILE]`; prints the figures and writes bench/results/fit.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import make_model  # noqa: E402

ARGS = ["--gpu", "H100-80GB", "--gpus", "8", "--context", "131072", "--concurrency", "16"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "fit.json")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvdoctor-fit-bench-"))
    try:
        model = make_model(tmp, "kimi-linear", shards=20)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "kvdoctor", "fit", str(model), *ARGS, "--format", "json"]
        subprocess.run(cmd, capture_output=True, env=env)  # writes the bytecode cache, as an install does
        cold = []
        for _ in range(args.runs):
            began = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            cold.append(time.perf_counter() - began)
            if proc.returncode not in (0, 1):
                raise SystemExit(proc.stderr)
        doc = json.loads(proc.stdout)
        from kvdoctor import api

        api.fit(model, gpu="H100-80GB", gpus=8, context=131072, concurrency=16)  # imports warm
        warm = []
        for _ in range(args.runs):
            began = time.perf_counter()
            api.fit(model, gpu="H100-80GB", gpus=8, context=131072, concurrency=16)
            warm.append(time.perf_counter() - began)
        out = {"tensors": doc["rows"][0]["weights"]["tensors"], "layouts": len(doc["rows"]), "runs": args.runs,
               "cold_process_s": {"median": statistics.median(cold), "min": min(cold), "max": max(cold)},
               "in_process_s": {"median": statistics.median(warm), "min": min(warm), "max": max(warm)}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
