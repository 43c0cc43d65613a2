"""SGLang's memory defaults oracle: the `mem_fraction_static`, chunked prefill and decode-graph batch a release's
own server arguments resolve for each real config on each GPU, on CUDA and on Apple silicon (MPS, the MLX backend).

Run with an SGLang venv (goldens/releases.py builds them):

    goldens/.venv/sglang/bin/python goldens/sglang_fraction_oracle.py            # rewrites sglang_fraction.json
    ... sglang_fraction_oracle.py --out FILE --configs DIR                       # another set of configs

Each (config, platform) runs in its own process: `ServerArgs(model_path=DIR, device=..., tp_size=...)` then
`resolve_once()`, the launcher's resolution (shims/sglang_api.py resolve: the constructor's up to 0.5.18), whose
memory step reads the device's memory. On CUDA the
device is `shims/cudafake.py`'s (torch reports GPUs of the scenario's memory); on MPS the resolution asks
`get_device_memory_capacity`, which on a Mac is torch.mps.recommended_max_memory() (Metal's recommended working
set), and the script answers it with the scenario's working set and sets SGLANG_USE_MLX's gate (`use_mlx`) true:
MPS and MLX are not on this box. What the script states itself: the memory figures below. Nothing else is
patched.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import forked  # noqa: E402 - goldens/common.py, standard library only

SHIMS = HERE.parent / "kvdoctor" / "engines" / "sglang" / "shims"
REAL = HERE.parent / "fixtures" / "configs" / "real"
OUT = HERE / "sglang_fraction.json"
GiB = 1 << 30

# (GPU, GiB the device reports, compute capability, TP sizes): the presets of kvdoctor/data/gpus.json
CUDA = (("H100-80GB", 79.18, (9, 0), (1, 8)), ("L4", 22.05, (8, 9), (1,)))
# Metal working sets (GiB): the Apple presets' figures and one of each memory tier of the resolution
MPS = (11.84, 24.0, 48.0, 72.0, 107.52, 175.78)
KEYS = ("mem_fraction_static", "chunked_prefill_size", "max_running_requests")


def scenarios(platform: str) -> list[dict]:
    if platform == "cuda":
        return [{"platform": "cuda", "gpu": g, "gib": gib, "capability": list(cap), "tp": tp}
                for g, gib, cap, tps in CUDA for tp in tps]
    return [{"platform": "mps", "gib": gib, "tp": 1} for gib in MPS]


def install_mps(gib: float) -> None:
    import sglang.srt.arg_groups.memory_hook as memory_hook

    memory_hook.get_device_memory_capacity = lambda device=None: gib * 1024
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang") and callable(getattr(module, "use_mlx", None)):
            module.use_mlx = lambda: True


def field(obj, name: str):
    """A field of the resolved settings, a dict (`resolved_dict`) or the release's object (up to 0.5.18)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def one(model_dir: Path, case: dict) -> dict:
    import sglang_api
    from sglang.srt.server_args import ServerArgs

    if case["platform"] == "mps":
        install_mps(case["gib"])
    try:  # up to 0.5.18 the constructor resolves (sglang_api.resolve)
        args = ServerArgs(model_path=str(model_dir), device="cuda" if case["platform"] == "cuda" else "mps",
                          tp_size=case["tp"])
        sglang_api.resolve(args)
    except Exception as exc:  # noqa: BLE001 - the release's refusal is its answer
        return {"error": {"class": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else ""}}
    d = sglang_api.resolved(args)
    graphs = d.get("cuda_graph_config") or {}
    decode, prefill = field(graphs, "decode") or {}, field(graphs, "prefill") or {}

    def backend(phase):  # an enum up to 0.5.18
        return getattr(field(phase, "backend"), "value", field(phase, "backend"))

    return {**{k: d.get(k) for k in KEYS}, "decode_graphs": backend(decode), "decode_max_bs": field(decode, "max_bs"),
            "prefill_graphs": backend(prefill)}


def point(config: Path, case: dict) -> dict:
    """One point, in a fork of the platform's process."""
    if case["platform"] == "cuda":
        import cudafake

        cudafake.install(devices=case["tp"], name=f"NVIDIA {case['gpu']}", capability=tuple(case["capability"]),
                         total_bytes=int(case["gib"] * GiB))
    with tempfile.TemporaryDirectory(prefix="kvdoctor-fraction-") as root:
        (Path(root) / "config.json").write_text(config.read_text())
        try:
            return one(Path(root), case)
        except Exception as exc:  # noqa: BLE001 - recorded: the point is not comparable
            return {"crash": f"{type(exc).__name__}: {exc}"[:300]}


def child(platform: str, configs: list[Path]) -> None:
    """Every point of one platform: SGLang imported once, each point in a fork (SGLang keeps process-wide state)."""
    sys.path[:0] = [str(HERE / "stubs"), str(SHIMS)]
    sys.path.append(str(HERE / ".venv-extra"))
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    if platform == "cuda":
        import cudafake
        import fakemods

        cudafake.install()
        fakemods.install()
    import sglang.srt.server_args  # noqa: F401 - imported once, before the forks

    point(configs[0], scenarios(platform)[0])  # what a resolution imports, imported before the forks too
    for config in configs:
        for case in scenarios(platform):
            result = forked(partial(point, config, case), lambda why: {"crash": why})
            print(json.dumps({"model": config.stem, **case, "result": result}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default=str(REAL))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--platform", choices=("cuda", "mps"))
    opts = parser.parse_args()
    configs = sorted(Path(opts.configs).glob("*.json"))
    if opts.platform:
        child(opts.platform, configs)
        return
    from importlib.metadata import version

    points = []
    children = [subprocess.Popen([sys.executable, __file__, "--platform", platform, "--configs", opts.configs],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for platform in ("cuda", "mps")]
    for proc in children:
        out, err = proc.communicate()
        points += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if proc.returncode:
            print(err[-3000:], file=sys.stderr)
    doc = {"schema": "kvdoctor.goldens/1", "engine": "sglang", "versions": {"sglang": version("sglang")},
           "made_by": "goldens/sglang_fraction_oracle.py", "points": points}
    Path(opts.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
