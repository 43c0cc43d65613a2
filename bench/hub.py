"""A Hub check of Kimi Linear 48B (21,128 tensors in 20 sparse shards) through a Hub on 127.0.0.1.

The Hub is the tests' server (tests/hub_server.py), so the figures are kvdoctor's and the client's own
cost with no network latency: what a real Hub adds is about one round trip per shard (or two, for a
header past the first 64 KiB) plus three for the commit, config and index, one target after another.
Cold processes, interleaved round by round:

  local     `check --static --format json DIR`, the same files as a directory (the reference)
  hub cold  `check --static --format json org/name` with an empty HF_HOME: every byte fetched
  hub warm  the same again, online: the commit asked, the metadata read from kvdoctor's cache
  offline   the same with HF_HUB_OFFLINE=1: no request

Usage: `python bench/hub.py [--runs N] [--json FILE]`; prints a table and writes bench/results/hub.json.
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
from hub_server import HubServer, Repo  # noqa: E402

REPO_ID = "moonshotai/Kimi-Linear-48B-A3B-Instruct"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict]:
    began = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - began
    if proc.returncode == 2:
        raise SystemExit(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return seconds, json.loads(proc.stdout)["results"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "hub.json")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvdoctor-hub-bench-"))
    try:
        model = make_model(tmp, "kimi-linear", shards=20)
        with HubServer({REPO_ID: Repo.from_dir(model)}) as hub:
            base = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0",
                    "HF_HUB_DISABLE_TELEMETRY": "1"}
            check = [sys.executable, "-m", "kvdoctor", "check", "--static", "--format", "json"]
            times: dict[str, list[float]] = {"local": [], "hub cold": [], "hub warm": [], "offline": []}
            served: dict[str, list[int]] = {name: [] for name in times}
            fetched, inside = 0, 0.0
            for round_ in range(args.runs):
                home = tmp / f"home-{round_}"
                env = {**base, "HF_HOME": str(home)}
                for name, target, where in (("local", str(model), env), ("hub cold", REPO_ID, env),
                                            ("hub warm", REPO_ID, env),
                                            ("offline", REPO_ID, {**env, "HF_HUB_OFFLINE": "1"})):
                    hub.reset()
                    seconds, result = timed([*check, target], where)
                    times[name].append(seconds)
                    served[name].append(hub.bytes_sent)
                    if name == "hub cold":
                        fetched = result["source"]["bytes_fetched"]
                        inside = result["source"]["seconds"]
        rows = {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                       "bytes_served": statistics.median(served[name])} for name, v in times.items()}
        doc = {"model": REPO_ID, "tensors": 21128, "shards": 20, "runs": args.runs, "rows": rows,
               "bytes_fetched": fetched, "fetch_seconds_last_cold_run": inside}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{'command':10} {'median s':>9} {'min..max s':>14} {'bytes served':>13}")
        for name, row in rows.items():
            print(f"{name:10} {row['median_s']:9.3f} {row['min_s']:6.3f}..{row['max_s']:<6.3f} "
                  f"{row['bytes_served']:13,.0f}")
        print(f"bytes fetched (source.bytes_fetched): {fetched:,}; fetch time inside the last cold run: {inside} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
