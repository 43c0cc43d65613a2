"""Benchmark: kvdoctor on real-sized (sparse) checkpoints against the floor and the meta-device peer.

Writes the layouts of bench/layouts.py as sparse safetensors files under bench/out/, then times cold
processes, interleaved round by round so machine noise hits every command alike:

  floor   a plain Python process that reads and parses every safetensors header (and the index)
  static  `kvdoctor check --static` (config and checkpoint rules; no caches built)
  full    `kvdoctor check --engine E` with the real caches and probes, per applicable engine
  peer    what a user would write instead: transformers' model on the `meta` device, parameter
          shapes compared with the headers

Each figure is the median over --runs cold processes with the min..max spread, plus the peak
resident memory of the process (os.wait4). Usage: `python bench/run.py [--runs N] [--json FILE]`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from layouts import LAYOUTS  # noqa: E402

from kvdoctor.synth import write_checkpoint  # noqa: E402

OUT = HERE / "out"
PY = sys.executable

FLOOR = r"""
import json, struct, sys
from pathlib import Path
d = Path(sys.argv[1])
json.loads((d / "model.safetensors.index.json").read_text())
n = 0
for f in sorted(d.glob("*.safetensors")):
    with f.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        n += len(json.loads(fh.read(size)))
print(n)
"""

PEER = r"""
import json, struct, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
d = Path(sys.argv[1])
headers = {}
for f in sorted(d.glob("*.safetensors")):
    with f.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        headers.update({k: v["shape"] for k, v in json.loads(fh.read(size)).items() if k != "__metadata__"})
config = AutoConfig.from_pretrained(str(d))
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config)
params = {k: list(v.shape) for k, v in model.state_dict().items()}
same = sum(1 for k, s in params.items() if headers.get(k) == s)
print(f"{same} of {len(params)} parameters match the {len(headers)} checkpoint tensors by name and shape")
"""


def materialize(name: str) -> Path:
    build, shards = LAYOUTS[name]
    cfg, layout = build()
    d = OUT / name
    stamp = d / ".layout.json"
    key = json.dumps([cfg, len(layout), shards])
    if stamp.exists() and stamp.read_text() == key:
        return d
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("*.safetensors"):
        old.unlink()
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    write_checkpoint(d, layout, shards=shards)
    stamp.write_text(key)
    return d


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(seconds, peak RSS in MB, exit code, last line of stdout) of one cold process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"})
    out = proc.stdout.read()
    proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = out.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return seconds, usage.ru_maxrss / 1024, proc.returncode, last[0][:100]


def engines_for(name: str) -> list[str]:
    from kvdoctor.engines import ENGINES

    wanted = {"kimi-linear-48b": ["sglang"], "gpt-oss-120b": ["sglang-mlx"]}[name]
    return [e for e in wanted if e in ENGINES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-peer", action="store_true", help="skip the transformers meta-device peer")
    args = parser.parse_args()

    rows = []
    for name in LAYOUTS:
        d = materialize(name)
        size = sum(p.stat().st_size for p in d.glob("*.safetensors"))
        ntensors = len(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"])
        cmds = {"floor": [PY, "-c", FLOOR, str(d)],
                "static": [PY, "-m", "kvdoctor", "check", str(d), "--static", "--format", "json"]}
        for engine in engines_for(name):
            cmds[f"full ({engine})"] = [PY, "-m", "kvdoctor", "check", str(d), "--engine", engine, "--format", "json"]
        if not args.no_peer:
            cmds["peer (transformers meta)"] = [PY, "-c", PEER, str(d)]
        samples: dict[str, list[tuple[float, float, int, str]]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for label, cmd in cmds.items():  # interleaved: one round runs every command once
                samples[label].append(timed(cmd))
        floor = statistics.median(s[0] for s in samples["floor"])
        peer_key = "peer (transformers meta)"
        peer = statistics.median(s[0] for s in samples[peer_key]) if peer_key in samples else None
        for label, runs in samples.items():
            secs = [s[0] for s in runs]
            med = statistics.median(secs)
            rows.append({
                "layout": name, "tensors": ntensors, "bytes": size, "command": label,
                "median_s": round(med, 3), "min_s": round(min(secs), 3), "max_s": round(max(secs), 3),
                "x_floor": round(med / floor, 2), "x_peer": round(med / peer, 3) if peer else None,
                "peak_rss_mb": round(max(s[1] for s in runs), 1), "exit_codes": sorted({s[2] for s in runs}),
                "last_line": runs[-1][3],
            })

    header = f"{'layout':16} {'tensors':>7} {'GB':>6} {'command':26} {'median s':>8} {'spread s':>13} {'x floor':>7} {'x peer':>7} {'RSS MB':>7} exit"
    print(header)
    print("-" * len(header))
    for r in rows:
        spread = f"{r['min_s']:.3f}-{r['max_s']:.3f}"
        peer = f"{r['x_peer']:.3f}" if r["x_peer"] is not None else "-"
        print(f"{r['layout']:16} {r['tensors']:>7} {r['bytes'] / 1e9:>6.1f} {r['command']:26} {r['median_s']:>8.3f} "
              f"{spread:>13} {r['x_floor']:>7.2f} {peer:>7} {r['peak_rss_mb']:>7.1f} {r['exit_codes']}")
    print(f"\n{args.runs} cold runs each, interleaved; python {sys.version.split()[0]}, {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
