"""Every launch command `kvdoctor fit` emits for the real configs, through the engine's own argument parser and
configuration: vLLM's create_engine_config (tests/vllm_launch_child.py in the vLLM venv), or SGLang's
prepare_server_args (tests/sglang_launch_child.py in an SGLang venv); how many parse and configure.

Usage: python tools/launch_check.py [--engine vllm|sglang|sglang-mlx] [--python PATH] [--gpus 1,2,8] [--limit N] [CONFIG.json ...]
Without configs, every fixtures/configs/real/*.json. Each model gets a sparse checkpoint of its real tensor
shapes (kvdoctor.load.synth) in a scratch folder; fit runs on H100-80GB (sglang-mlx: M-series-128GB) at min(32k, the model's longest
context) for each GPU count, and every row's command plus the recommendation's is checked once.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


CHILD = {"vllm": "vllm_launch_child.py", "sglang": "sglang_launch_child.py", "sglang-mlx": "sglang_launch_child.py"}
PYTHON = {"vllm": os.environ.get("KVDOCTOR_VLLM_PYTHON", "/tmp/ux/venvs/vllm/bin/python"),
          "sglang": os.environ.get("KVDOCTOR_SGLANG_PYTHON", ""),
          "sglang-mlx": os.environ.get("KVDOCTOR_SGLANG_PYTHON", "")}
GPU = {"sglang-mlx": "M-series-128GB"}  # the engine's machine; H100-80GB for the others


def baseline_command(engine: str, model: Path) -> list[str]:
    """The engine started on the model with no flag of fit's: does it configure the model at all?"""
    if engine == "vllm":
        return ["vllm", "serve", str(model)]
    mlx = ["env", "SGLANG_USE_MLX=1"] if engine == "sglang-mlx" else []
    return mlx + ["python", "-m", "sglang.launch_server", "--model-path", str(model)]


def commands_for(config_path: Path, scratch: Path, gpus: list[int],
                 engine: str = "vllm") -> tuple[list[list[str]], str | None]:
    from kvdoctor import api
    from kvdoctor.errors import InputError
    from kvdoctor.load.synth import layout_for, write_checkpoint

    d = scratch / config_path.stem
    d.mkdir()
    config = json.loads(config_path.read_text())
    (d / "config.json").write_text(json.dumps(config))
    out: list[list[str]] = []
    try:
        layout = layout_for(d)
    except (KeyError, TypeError, ValueError) as exc:  # a config synth cannot lay out: no checkpoint to price
        return out, f"no synthetic checkpoint ({type(exc).__name__}: {exc})"
    try:
        write_checkpoint(d, layout)
        text = config.get("text_config") or config
        context = min(32768, int(text.get("max_position_embeddings") or 32768))
        for n in gpus:
            if engine == "sglang-mlx" and n != 1:
                continue  # one machine
            doc = api.fit(d, engine=engine, gpu=GPU.get(engine, "H100-80GB"), gpus=n, context=context)
            for launch in [r["launch"] for r in doc["rows"]] + [(doc.get("recommendation") or {}).get("launch")]:
                if launch and launch not in out:
                    out.append(launch)
    except InputError as exc:
        return out, str(exc).replace(str(scratch) + "/", "")
    return out, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", type=Path)
    ap.add_argument("--engine", choices=sorted(CHILD), default="vllm")
    ap.add_argument("--python", default="", help="the engine venv's python (default: KVDOCTOR_VLLM_PYTHON / "
                                                 "KVDOCTOR_SGLANG_PYTHON)")
    ap.add_argument("--gpus", default="1,2,8")
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    configs = args.configs or sorted((ROOT / "fixtures" / "configs" / "real").glob("*.json"))
    if args.limit:
        configs = configs[:args.limit]
    gpus = [int(g) for g in args.gpus.split(",")]
    with tempfile.TemporaryDirectory(prefix="kvdoctor-launch-") as name:
        scratch = Path(name)
        commands: list[list[str]] = []
        owner: list[str] = []
        not_fitted: dict[str, str] = {}
        baseline: dict[str, int] = {}  # model -> index of `vllm serve DIR` alone: does vLLM configure the model at all?
        for path in configs:
            cmds, why = commands_for(path, scratch, gpus, args.engine)
            if why:
                not_fitted[path.stem] = why
            if cmds:
                baseline[path.stem] = len(commands)
                commands.append(baseline_command(args.engine, scratch / path.stem))
                owner.append(path.stem)
            commands += cmds
            owner += [path.stem] * len(cmds)
        listing = scratch / "commands.json"
        listing.write_text(json.dumps(commands))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
        python = args.python or PYTHON[args.engine]
        if not python:
            sys.exit(f"give --python: the {args.engine} venv's python")
        proc = subprocess.run([python, str(ROOT / "tests" / CHILD[args.engine]), str(listing)],
                              capture_output=True, text=True, env=env)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or len(results) != len(commands):
        sys.exit(f"the vLLM child stopped after {len(results)} of {len(commands)} commands:\n{proc.stderr[-3000:]}")
    base = set(baseline.values())
    unsupported = {stem for stem, i in baseline.items() if "error" in results[i]}
    fit_rows = [(stem, cmd, r) for i, (stem, cmd, r) in enumerate(zip(owner, commands, results)) if i not in base]
    checked = [(stem, cmd, r) for stem, cmd, r in fit_rows if stem not in unsupported]
    stages = Counter(r.get("stage", "ok") for _, _, r in checked)
    print(f"{args.engine}: {len(fit_rows)} commands from {len(baseline)} models; {len(unsupported)} models the engine "
          f"does not configure even started alone on them (their {len(fit_rows) - len(checked)} commands set aside); "
          f"of the other {len(checked)}: {stages['ok']} parse and configure, {stages['parse']} rejected by the "
          f"parser, {stages['config']} by create_engine_config")
    for stem, cmd, r in checked:
        if "error" in r:
            print(f"  {stem}: {r['stage']}: {r['error'][:300]}\n    {' '.join(cmd[2:])}")
    for stem in sorted(unsupported):
        print(f"  model not configured by the engine here: {stem}: {results[baseline[stem]]['error'][:160]}")
    for stem, why in not_fitted.items():
        print(f"  not fitted: {stem}: {why[:200]}")


if __name__ == "__main__":
    main()
