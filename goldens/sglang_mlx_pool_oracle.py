"""sglang's MLX backend pool oracle: the slots its runner auto-sizes for the shared attention KV pool, for every
real config mlx-lm builds, in a few memory states of a Mac.

Run with kvdoctor's venv (mlx[cpu], mlx-lm and sglang --no-deps, as `make venv` builds it):

    .venv/bin/python goldens/sglang_mlx_pool_oracle.py          # rewrites goldens/sglang_mlx_pool.json

The code that decides is the engine's: the MLX backend is loaded from the installed sglang wheel
(kvdoctor.engines.sglang_mlx.dryrun.engine_import, which the dry run uses), mlx-lm builds the full-size model
from config.json with its own loader and no weights (parameters stay lazy; floats in the checkpoint's dtype),
the backend's `patch_model_attention`, `find_attention_layers`, `get_layer_window_sizes` and
`MlxModelCacheLayout.from_attention_discovery` lay it out as `MlxModelRunner.__init__` does, and
`MlxModelRunner._compute_pool_size` sizes the pool. What the script states itself, as a Mac would report it: the
Metal working set (mx.device_info), the MLX memory in use after loading (mx.get_active_memory) and the memory
macOS reports available (psutil.virtual_memory), per state in STATES, and the mem_fraction_static.
"""
from __future__ import annotations

import json
import sys
import types
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from common import forked  # noqa: E402 - goldens/common.py, standard library only

REAL = HERE.parent / "fixtures" / "configs" / "real"
OUT = HERE / "sglang_mlx_pool.json"
GiB = 1 << 30

# (working set, in use, available, mem_fraction_static): a mid machine; weights past the budget (the floor); the
# memory macOS reports available binding; a large machine
STATES = ((48 * GiB, 10 * GiB, 60 * GiB, 0.861), (int(107.52 * GiB), 100 * GiB, 120 * GiB, 0.878),
          (int(11.84 * GiB), 2 * GiB, 5 * GiB, 0.693), (int(175.78 * GiB), 30 * GiB, 150 * GiB, 0.854))


def layout_runner(backend, config: dict, fraction: float):
    """An MlxModelRunner laid out as its __init__ lays one out, without loading weights."""
    from kvdoctor.engines.sglang_mlx.dryrun.shrink import cast_floats, load_weightless

    model, _ = load_weightless(config)
    text = config.get("text_config") or config
    cast_floats(model, next((c[k] for c in (text, config) for k in ("torch_dtype", "dtype") if c.get(k)), None))
    mr = backend.model_runner
    runner = object.__new__(mr.MlxModelRunner)
    runner.model = model
    runner._mem_fraction_static = fraction
    mr.patch_model_attention(model)
    layers, attrs = mr.find_attention_layers(model)
    runner._cache_layout = mr.MlxModelCacheLayout.from_attention_discovery(
        layers, attrs, layer_window_sizes=mr.get_layer_window_sizes(model))
    return runner


def machine(mr, working_set: int, in_use: int, available: int) -> None:
    """What the runner module reads of the Mac: Metal's working set, MLX's memory in use, macOS's available."""
    info = {"max_recommended_working_set_size": working_set, "memory_size": working_set}
    mr.mx = types.SimpleNamespace(**{**{k: getattr(sys.modules["mlx.core"], k) for k in dir(sys.modules["mlx.core"])
                                        if not k.startswith("__")},
                                     "device_info": lambda: info, "get_active_memory": lambda: in_use})
    mr.psutil = types.SimpleNamespace(virtual_memory=lambda: types.SimpleNamespace(available=available))


def points_of(backend, name: str, config: dict) -> list[dict]:
    mr = backend.model_runner
    real_mx, real_psutil = mr.mx, mr.psutil
    out = []
    try:
        for working_set, in_use, available, fraction in STATES:
            point = {"model": name, "working_set": working_set, "in_use": in_use, "available": available,
                     "mem_fraction_static": fraction}
            try:
                runner = layout_runner(backend, config, fraction)
                layout = runner._cache_layout
                machine(mr, working_set, in_use, available)
                point["pool_size"] = runner._compute_pool_size(None)
                n_kv, head_dim, dtype = runner._get_attn_config()
                point.update(n_kv_heads=int(n_kv), head_dim=int(head_dim), dtype=str(dtype).removeprefix("mlx.core."),
                             full_layers=layout.num_full_attention_layers,
                             attention_layers=layout.num_attention_layers,
                             sliding_layers=len(layout.swa_attention_layer_indices))
            except Exception as exc:  # noqa: BLE001 - the engine's (or mlx-lm's) refusal is its answer
                point["error"] = {"class": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else ""}
            finally:
                mr.mx, mr.psutil = real_mx, real_psutil
            out.append(point)
    finally:
        mr.mx, mr.psutil = real_mx, real_psutil
    return out


def main() -> None:
    from kvdoctor.engines.sglang_mlx.dryrun.engine_import import installed_versions, load_mlx_backend

    backend = load_mlx_backend()
    points = []
    for path in sorted(REAL.glob("*.json")):  # one model per fork: its lazy graph and mlx-lm's imports stay there
        points += forked(partial(points_of, backend, path.stem, json.loads(path.read_text())),
                         lambda why, model=path.stem: [{"model": model, "crash": why}])
        print(path.stem, file=sys.stderr)
    doc = {"schema": "kvdoctor.goldens/1", "engine": "sglang-mlx", "versions": installed_versions(),
           "made_by": "goldens/sglang_mlx_pool_oracle.py", "points": points}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
