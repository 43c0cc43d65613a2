"""Benchmark: static checks against the header-parse floor, dry runs, fleets, shards and Ray.

Sections (`--only static,profile,dryrun,fleet,ray`; all by default):

  static   real-sized (sparse) checkpoints of bench/layouts.py, cold processes interleaved round by
           round so machine noise hits every command alike: the floor (a plain Python process that
           parses every safetensors header and the index), `check --static`, `check --engine E` and
           the transformers meta-device peer. Median, min..max, ratio to the floor, peak RSS.
  profile  where the static check's time goes: an `-X importtime` summary by package and a cProfile
           top-10 (by own time) of the largest layout.
  dryrun   `check --engine sglang-mlx --dry-run` of config-only dirs: gpt-oss-20b, gemma-2-2b and
           Qwen3-Next (median, spread, peak RSS over --dry-runs runs), then peak RSS of one run of every
           config in fixtures/configs/real (or --configs DIR: its *.json files).
  fleet    100 and 1,000 real-layout sparse checkpoints (the fixture configs, hard-linked copies)
           checked in one command at -j 1 and -j 2, interleaved: seconds, targets per second, speed-up.
  ray      the 100-target fleet through `--executor ray` on a local head started here (127.0.0.1),
           against the local run's JSON.

Usage: `python bench/run.py [--runs N] [--json FILE] [--only SECTIONS] [--no-peer]`. The box is shared,
so each figure is a median of interleaved cold runs; `docs/performance.md` says how noisy they were.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from layouts import LAYOUTS  # noqa: E402

from kvdoctor.load.synth import write_checkpoint  # noqa: E402

OUT = HERE / "out"
PY = sys.executable
ROOT = HERE.parent
FIXTURES = ROOT / "fixtures" / "models"
REAL_CONFIGS = ROOT / "fixtures" / "configs" / "real"  # the repository's real configs (sources in SOURCES.md)
DRY_RUN_MODELS = ("openai__gpt-oss-20b", "google__gemma-2-2b", "Qwen__Qwen3-Next-80B-A3B-Instruct")

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


def env() -> dict[str, str]:
    """What a user's shell gives: Python writes and reuses its bytecode caches. (Sandboxes often set
    PYTHONDONTWRITEBYTECODE, which makes every cold process compile kvdoctor's sources again.) Read at
    each call: a section may set variables for its commands (the Ray one does)."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "COLUMNS": "120"}


def timed(cmd: list[str], cwd: Path | None = None, keep: bool = False) -> tuple[float, float, int, str, float]:
    """(seconds, peak RSS in MB, exit code, last line of stdout or all of it with `keep`, CPU seconds)
    of one cold process. The output goes through a temporary file, so a large report costs no pipe
    round trips."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env())
        _pid, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    last = text if keep else (text.strip().splitlines()[-1:] or [""])[0][:100]
    return seconds, usage.ru_maxrss / 1024, code, last, usage.ru_utime + usage.ru_stime


GNU_TIME = shutil.which("time") or "/usr/bin/time"


def own_peak_rss_mb(cmd: list[str]) -> float | None:
    """The peak RSS of one more run of `cmd`, started by GNU time (a small process): os.wait4's figure
    is at least the bench's own size, which the child holds between fork and exec. None without GNU time."""
    import tempfile

    if not os.access(GNU_TIME, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile("r") as out:
        done = subprocess.run([GNU_TIME, "-f", "%M", "-o", out.name, *cmd], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env())
        text = out.read().strip().splitlines()
    return round(int(text[-1]) / 1024, 1) if done.returncode in (0, 1, 2) and text and text[-1].isdigit() else None


def figures(samples: list[tuple]) -> dict:
    secs = [s[0] for s in samples]
    return {"median_s": round(statistics.median(secs), 3), "min_s": round(min(secs), 3), "max_s": round(max(secs), 3),
            "cpu_s": round(statistics.median(s[4] for s in samples), 3),
            "peak_rss_mb": round(max(s[1] for s in samples), 1), "exit_codes": sorted({s[2] for s in samples})}


def engines_for(name: str) -> list[str]:
    from kvdoctor.engines import check_engines

    wanted = {"kimi-linear-48b": ["sglang"], "gpt-oss-120b": ["sglang-mlx"]}[name]
    return [e for e in wanted if e in check_engines()]


def kvdoctor(*args: str) -> list[str]:
    return [PY, "-m", "kvdoctor", *args]


# -- static: the floor, the static check, the full check, the peer -------------------------------

def bench_static(runs: int, peer: bool) -> list[dict]:
    rows = []
    for name in LAYOUTS:
        d = materialize(name)
        size = sum(p.stat().st_size for p in d.glob("*.safetensors"))
        ntensors = len(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"])
        cmds = {"floor": [PY, "-c", FLOOR, str(d)], "static": kvdoctor("check", str(d), "--static", "--format", "json"),
                "static, sarif": kvdoctor("check", str(d), "--static", "--format", "sarif")}  # a CI gate's report
        for engine in engines_for(name):
            cmds[f"full ({engine})"] = kvdoctor("check", str(d), "--engine", engine, "--format", "json")
        if peer:
            cmds["peer (transformers meta)"] = [PY, "-c", PEER, str(d)]
        samples: dict[str, list[tuple]] = {k: [] for k in cmds}
        for cmd in cmds.values():  # warm-up, not counted: bytecode caches written, files in the page cache
            timed(cmd)
        for _ in range(runs):
            for label, cmd in cmds.items():  # interleaved: one round runs every command once
                samples[label].append(timed(cmd))
        floor = statistics.median(s[0] for s in samples["floor"])
        floor_cpu = statistics.median(s[4] for s in samples["floor"])
        peer_key = "peer (transformers meta)"
        peer_s = statistics.median(s[0] for s in samples[peer_key]) if peer_key in samples else None
        for label, runs_ in samples.items():
            row = {"layout": name, "tensors": ntensors, "bytes": size, "command": label, **figures(runs_),
                   "last_line": runs_[-1][3]}
            row["x_floor"] = round(row["median_s"] / floor, 2)
            row["x_floor_cpu"] = round(row["cpu_s"] / floor_cpu, 2)
            # the ratio within each round, then its median: both commands saw the same moment's load
            row["x_floor_paired"] = round(statistics.median(a[0] / b[0] for a, b in zip(runs_, samples["floor"])), 2)
            row["x_peer"] = round(row["median_s"] / peer_s, 3) if peer_s else None
            row["peak_rss_mb"] = own_peak_rss_mb(cmds[label]) or row["peak_rss_mb"]
            rows.append(row)
    print(f"\n{'layout':16} {'tensors':>7} {'GB':>6} {'command':26} {'median s':>8} {'spread s':>13} "
          f"{'x floor':>7} {'paired':>6} {'cpu x':>6} {'x peer':>7} {'RSS MB':>7} exit")
    for r in rows:
        peer_x = f"{r['x_peer']:.3f}" if r["x_peer"] is not None else "-"
        print(f"{r['layout']:16} {r['tensors']:>7} {r['bytes'] / 1e9:>6.1f} {r['command']:26} {r['median_s']:>8.3f} "
              f"{r['min_s']:.3f}-{r['max_s']:.3f} {r['x_floor']:>7.2f} {r['x_floor_paired']:>6.2f} "
              f"{r['x_floor_cpu']:>6.2f} {peer_x:>7} {r['peak_rss_mb']:>7.1f} {r['exit_codes']}")
    return rows


# -- profile: -X importtime and cProfile of the largest static check --------------------------------

def bench_profile() -> dict:
    d = materialize("kimi-linear-48b")
    cmd = ["check", str(d), "--static", "--format", "json"]
    proc = subprocess.run([PY, "-X", "importtime", "-m", "kvdoctor", *cmd], capture_output=True, text=True, env=env())
    by_package: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _cumulative, name = line[len("import time:"):].split("|")
        if not self_us.strip().isdigit():
            continue
        name = name.strip()
        package = ".".join(name.split(".")[:2]) if name.startswith("kvdoctor.") else name.split(".")[0]
        by_package[package] = by_package.get(package, 0.0) + int(self_us) / 1000
    imports = sorted(by_package.items(), key=lambda kv: -kv[1])
    total = sum(by_package.values())
    print(f"\n-X importtime of `kvdoctor {' '.join(cmd[:1])} --static` (Kimi-Linear-48B): {total:.1f} ms of imports; "
          "by package (own time):")
    for package, ms in imports[:12]:
        print(f"  {ms:7.1f} ms  {package}")
    # typer reads every command line (there is no second parser): what its import costs a static check
    cli_ms = sum(by_package.get(name, 0.0) for name in ("typer", "click", "shellingham"))
    print(f"  typer's own import (typer, click, shellingham): {cli_ms:.1f} ms of the {total:.1f} ms")
    profile_path = OUT / "static.prof"
    subprocess.run([PY, "-m", "cProfile", "-o", str(profile_path), "-m", "kvdoctor", *cmd], capture_output=True, env=env())
    text = io.StringIO()
    stats = pstats.Stats(str(profile_path), stream=text)
    stats.sort_stats("tottime").print_stats(10)
    top = [line for line in text.getvalue().splitlines() if line.strip()][-11:]
    print("cProfile top-10 by own time (profiling itself inflates the figures):")
    for line in top:
        print("  " + line.strip())
    return {"imports_ms": round(total, 1), "typer_import_ms": round(cli_ms, 1),
            "imports_by_package_ms": {k: round(v, 1) for k, v in imports[:20]},
            "cprofile_top10": top[1:]}


# -- dry runs ---------------------------------------------------------------------------------------

def config_dirs(source: Path) -> dict[str, Path]:
    """One config-only model dir per config file (NAME.json -> OUT/configs/NAME/config.json); an error
    when SOURCE holds none, so a sweep is never silently empty."""
    dirs = {}
    configs = sorted(source.glob("*.json"))
    if not configs:
        raise SystemExit(f"{source}: no *.json config files for the dry-run sweep (--configs DIR)")
    for path in configs:
        d = OUT / "configs" / path.stem
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, d / "config.json")
        dirs[path.stem] = d
    return dirs


def _dry_run_info(text: str) -> dict:
    try:
        result = json.loads(text)["results"][0]
    except (json.JSONDecodeError, KeyError, IndexError):
        return {}
    info = result.get("info", {}).get("dry_run") or {}
    sliding = [layer for layer in info.get("layers", []) if layer.get("engine_window")]
    decode = sorted({k for layer in sliding for step in layer.get("decode_keys", []) for k in step})
    return {"outcome": info.get("outcome"), "child_s": info.get("seconds"),
            "shrink": (info.get("shrink") or {}).get("candidate"),
            "estimated_s": (info.get("schedule") or {}).get("estimated_seconds"),
            "sliding_decode_keys": decode, "codes": [f["code"] for f in result.get("findings", [])]}


def bench_dryrun(runs: int, source: Path) -> list[dict]:
    dirs = config_dirs(source)
    rows = []
    chosen = [name for name in DRY_RUN_MODELS if name in dirs]
    samples: dict[str, list[tuple]] = {name: [] for name in chosen}
    for _ in range(runs):
        for name in chosen:
            samples[name].append(timed(kvdoctor("check", str(dirs[name]), "--engine", "sglang-mlx", "--dry-run",
                                                "--format", "json"), keep=True))
    for name in dirs:
        if name not in samples:
            samples[name] = [timed(kvdoctor("check", str(dirs[name]), "--engine", "sglang-mlx", "--dry-run",
                                            "--format", "json"), keep=True)]
    print(f"\n{'dry run (config only)':40} {'runs':>4} {'median s':>8} {'spread s':>13} {'RSS MB':>7} outcome / shrink")
    for name, runs_ in samples.items():
        row = {"model": name, "runs": len(runs_), **figures(runs_), **_dry_run_info(runs_[-1][3])}
        rows.append(row)
        print(f"{name:40} {row['runs']:>4} {row['median_s']:>8.2f} {row['min_s']:.2f}-{row['max_s']:.2f} "
              f"{row['peak_rss_mb']:>7.0f} {row.get('outcome')} / {row.get('shrink')}; sliding decode keys "
              f"{row.get('sliding_decode_keys')}")
    return rows


DRY_FLEET = ("openai__gpt-oss-20b", "google__gemma-3-1b-it", "meta-llama__Llama-3.1-8B", "mistralai__Mistral-7B-v0.1")


def bench_dry_fleet(runs: int, source: Path) -> list[dict]:
    """Dry runs of several models: one command per model (each pays the engine's import) against one
    command for all of them at -j 1 and -j 2 (a warm child per worker imports it once)."""
    dirs = config_dirs(source)
    chosen = [str(dirs[name]) for name in DRY_FLEET if name in dirs]
    args = ("--engine", "sglang-mlx", "--dry-run", "--format", "json")
    samples: dict[str, list[tuple]] = {"one command each": [], "one command, -j 1": [], "one command, -j 2": []}
    for _ in range(runs):
        singles = [timed(kvdoctor("check", d, *args)) for d in chosen]
        samples["one command each"].append((sum(t[0] for t in singles), max(t[1] for t in singles),
                                            max(t[2] for t in singles), "", sum(t[4] for t in singles)))
        for j in (1, 2):
            samples[f"one command, -j {j}"].append(timed(kvdoctor("check", *chosen, *args, "-j", str(j))))
    rows = []
    print(f"\n{'dry runs of ' + str(len(chosen)) + ' models':28} {'median s':>8} {'spread s':>13} {'cpu s':>6} "
          f"{'s/model':>7} {'RSS MB':>7} exit")
    for label, runs_ in samples.items():
        row = {"models": len(chosen), "how": label, **figures(runs_)}
        rows.append(row)
        print(f"{label:28} {row['median_s']:>8.2f} {row['min_s']:.2f}-{row['max_s']:.2f} {row['cpu_s']:>6.2f} "
              f"{row['median_s'] / len(chosen):>7.2f} {row['peak_rss_mb']:>7.0f} {row['exit_codes']}")
    return rows


# -- fleets -----------------------------------------------------------------------------------------

FLEET_MAX_TENSORS = 5000  # leaves out Kimi-Linear-48B (21k tensors) and Qwen3-Next (74k): the static rows time them


def fleet(size: int) -> Path:
    """`size` model dirs: the fixture configs of at most FLEET_MAX_TENSORS tensors (eight: dense models
    and gpt-oss-20b) with real-layout sparse checkpoints in two shards, as hard-linked copies."""
    from kvdoctor.load.synth import layout_for

    base = OUT / "fleet-base"
    names = []
    for name in sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").exists()):
        d = base / name
        if not (d / ".done").exists():
            d.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(FIXTURES / name / "config.json", d / "config.json")
            write_checkpoint(d, layout_for(d), shards=2)
            (d / ".done").touch()
        if len(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]) <= FLEET_MAX_TENSORS:
            names.append(name)
    d = OUT / f"fleet-{size}"
    if (d / ".done").exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    for i in range(size):
        src = base / names[i % len(names)]
        target = d / f"{i:04d}-{src.name}"
        target.mkdir(parents=True)
        for f in src.iterdir():
            if f.name != ".done":
                os.link(f, target / f.name)
    (d / ".done").touch()
    return d


def halves(d: Path) -> tuple[list[str], list[str]]:
    """The fleet's targets in two halves with the same mix of models: sorted by model, then dealt
    alternately (the fleet cycles through its models, so every other target would put all of one
    model in one half)."""
    targets = sorted((p for p in d.iterdir() if p.is_dir()), key=lambda p: (p.name.split("-", 1)[1], p.name))
    return [str(p) for p in targets[0::2]], [str(p) for p in targets[1::2]]


def side_by_side(cmds: list[list[str]]) -> tuple:
    """`timed`'s figures for commands started together: the wall time until the last ends, the
    largest peak RSS, the worst exit code, no output, and their CPU seconds together."""
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env()) for cmd in cmds]
    waited = [os.wait4(proc.pid, 0) for proc in procs]
    seconds = time.perf_counter() - start
    codes = [os.waitstatus_to_exitcode(status) for _pid, status, _usage in waited]
    return (seconds, max(u.ru_maxrss for _p, _s, u in waited) / 1024, max(codes), "",
            sum(u.ru_utime + u.ru_stime for _p, _s, u in waited))


# The fleet's rows: the JSON report a CI job reads, statically and with the hf profile's caches, and the
# terminal report (rich, the default format), which the -j workers render too.
FLEET_MODES = {"static": ["--static", "--format", "json"], "static, rich": ["--static", "--format", "rich"],
               "full (hf)": ["--format", "json"]}


def bench_fleet(runs: int) -> list[dict]:
    """-j 1 and -j 2 on fleets of 4, 100 and 1,000 targets (4 static ones: too few to repay a pool,
    which -j 2 must then not start). For 100 static targets also "1+1": two -j 1 processes side by
    side, each checking half the fleet. They share nothing and talk to no one, so
    their speed-up over -j 1 is what two cores give this workload on this box; -j 2 (one import, two
    forked workers) can pass it only by the serial start-up it saves."""
    rows = []
    for size, modes in ((4, ("static",)), (100, ("static", "static, rich", "full (hf)")), (1000, ("static",))):
        d = fleet(size)
        for mode in modes:
            args = FLEET_MODES[mode]
            runners: dict[int | str, Callable[[], tuple]] = {
                j: partial(timed, kvdoctor("check", str(d), *args, "-j", str(j))) for j in (1, 2)}
            if size == 100 and mode == "static":
                runners["1+1"] = partial(side_by_side, [kvdoctor("check", *half, *args, "-j", "1")
                                                        for half in halves(d)])
            samples: dict[int | str, list[tuple]] = {j: [] for j in runners}
            for _ in range(runs):
                for j, run in runners.items():
                    samples[j].append(run())
            one = statistics.median(s[0] for s in samples[1])
            for j, runs_ in samples.items():
                row = {"targets": size, "mode": mode, "jobs": j, **figures(runs_)}
                row["targets_per_s"] = round(size / row["median_s"], 1)
                row["speedup_vs_j1"] = round(one / statistics.median(r[0] for r in runs_), 2)
                row["speedup_paired"] = round(statistics.median(a[0] / b[0] for a, b in zip(samples[1], runs_)), 2)
                rows.append(row)
    print(f"\n{'fleet':>6} {'mode':12} {'-j':>3} {'median s':>8} {'spread s':>13} {'targets/s':>9} {'x -j 1':>6} "
          f"{'paired':>6} exit")
    for r in rows:
        print(f"{r['targets']:>6} {r['mode']:12} {r['jobs']:>3} {r['median_s']:>8.2f} {r['min_s']:.2f}-{r['max_s']:.2f} "
              f"{r['targets_per_s']:>9.1f} {r['speedup_vs_j1']:>6.2f} {r['speedup_paired']:>6.2f} {r['exit_codes']}")
    return rows


# -- ray --------------------------------------------------------------------------------------------

def bench_ray(runs: int) -> dict:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep the head on 127.0.0.1 (tests do the same)
    try:
        import ray
    except ImportError:
        print("\nray: not installed (pip install 'kvdoctor[ray]'); section skipped")
        return {"skipped": "ray not installed"}
    d = fleet(100)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        address = ray.get_runtime_context().gcs_address
        local_cmd = kvdoctor("check", str(d), "--static", "--format", "json", "-j", "2")
        ray_cmd = kvdoctor("check", str(d), "--static", "--format", "json", "--executor", "ray", "--ray-address", address)
        local, remote = [], []
        for _ in range(runs):
            local.append(timed(local_cmd, keep=True))
            remote.append(timed(ray_cmd, keep=True))
    finally:
        ray.shutdown()
    same = all(r[3] == local[0][3] for r in remote)
    row = {"address": address, "targets": 100, "local_j2": figures(local), "ray": figures(remote), "same_json": same}
    print(f"\nray on a local head at {address}: 100 static targets in {row['ray']['median_s']:.2f} s "
          f"({row['ray']['min_s']:.2f}-{row['ray']['max_s']:.2f}) against {row['local_j2']['median_s']:.2f} s "
          f"locally at -j 2; JSON identical to the local run's: {same}")
    return row


CALIBRATION = "import time\nt = time.perf_counter()\ns = 0\nfor i in range(10_000_000):\n    s += i\nprint(time.perf_counter() - t)"


def calibration() -> float:
    """The best of three runs of a fixed pure-Python loop: how fast this box is, so that figures from
    different sessions (different machines) can be compared."""
    return round(min(float(subprocess.run([PY, "-c", CALIBRATION], capture_output=True, text=True,
                                          env=env()).stdout) for _ in range(3)), 3)


def two_process_scaling(rounds: int = 5) -> float:
    """How much faster two copies of the calibration loop finish side by side than one after the
    other (median of `rounds`): on a shared or throttled box two processes get less than 2x, and a
    -j 2 fleet can never scale better than this."""
    def wall(side_by_side: bool) -> float:
        start = time.perf_counter()
        if side_by_side:
            procs = [subprocess.Popen([PY, "-c", CALIBRATION], stdout=subprocess.DEVNULL, env=env()) for _ in range(2)]
            for proc in procs:
                proc.wait()
        else:
            for _ in range(2):
                subprocess.run([PY, "-c", CALIBRATION], stdout=subprocess.DEVNULL, env=env(), check=True)
        return time.perf_counter() - start

    return round(statistics.median(wall(False) / wall(True) for _ in range(rounds)), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="cold runs per static and fleet figure")
    parser.add_argument("--dry-runs", type=int, default=3, help="runs per dry-run model")
    parser.add_argument("--fleet-runs", type=int, default=11,
                        help="runs per local fleet and Ray figure (each a few seconds at most: a median of 11 is one "
                             "the box's neighbours move little)")
    parser.add_argument("--dry-fleet-runs", type=int, default=3, help="runs per dry-run fleet figure")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "bench.json")
    parser.add_argument("--only", default="static,profile,dryrun,dryfleet,fleet,ray")
    parser.add_argument("--configs", type=Path, default=REAL_CONFIGS, help="config files for the dry-run RSS sweep")
    parser.add_argument("--no-peer", action="store_true", help="skip the transformers meta-device peer")
    args = parser.parse_args()
    only = set(args.only.split(","))
    OUT.mkdir(exist_ok=True)
    started = time.time()
    load = os.getloadavg()
    doc: dict = {"python": sys.version.split()[0], "cores": os.cpu_count(), "load_before": [round(x, 1) for x in load],
                 "calibration_s": calibration()}
    print(f"calibration: a 10M-step pure-Python loop takes {doc['calibration_s']:.2f} s on this box "
          "(compare figures across boxes by it)")
    if "fleet" in only:
        doc["two_process_scaling"] = two_process_scaling()
        print(f"two such loops side by side finish {doc['two_process_scaling']:.2f}x faster than one after the other "
              "(the most -j 2 can gain here)")
    if "static" in only:
        doc["static"] = bench_static(args.runs, not args.no_peer)
    if "profile" in only:
        doc["profile"] = bench_profile()
    if "dryrun" in only:
        doc["dryrun"] = bench_dryrun(args.dry_runs, args.configs)
    if "dryfleet" in only:
        doc["dry_fleet"] = bench_dry_fleet(args.dry_fleet_runs, args.configs)
    if "fleet" in only:
        doc["fleet"] = bench_fleet(args.fleet_runs)
    if "ray" in only:
        doc["ray"] = bench_ray(args.fleet_runs)
    doc["load_after"] = [round(x, 1) for x in os.getloadavg()]
    doc["minutes"] = round((time.time() - started) / 60, 1)
    print(f"\npython {doc['python']}, {doc['cores']} cores, load average {doc['load_before']} before, "
          f"{doc['load_after']} after; {doc['minutes']} min")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        previous = json.loads(args.json.read_text()) if args.json.exists() else {}
        if isinstance(previous, dict):
            previous.update(doc)
            doc = previous
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
