"""Invariant probe on SGLang's own pool classes: observations, never catalog codes.

`observe` runs `probe_child.py` in an interpreter that has SGLang 0.5.23 (`KVDOCTOR_SGLANG_PYTHON`, or the
one given) on a directory holding the model's config.json, and gets back where a canary written through
each layer's own SGLang accessor landed. `invariants` sets that against the static plan:

- reach: the canary of layer L lands in exactly one buffer, the one the plan gives L (pool, pool_index);
- no aliasing: no two layers' accessors return the same buffer;
- dense: each pool's indices are 0..n-1, every buffer used by exactly one layer.

Not probed here: that a sliding layer's reads stay inside its window; `--dry-run` checks that with SGLang's
torch-native attention backend (engines/sglang_cuda/startup.py), the one that runs on a CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Sequence

from kvdoctor.engines.base import LayerPlan

CHILD = Path(__file__).resolve().parent / "probe_child.py"
MARK = "KVDOCTOR-PROBE "


def interpreter() -> str | None:
    value = os.environ.get("KVDOCTOR_SGLANG_PYTHON")
    return value if value and Path(value).exists() else None


def observe(model_dir: Path, settings: dict[str, Any], python: str, timeout: float = 600) -> dict[str, Any]:
    """Where each layer's canary landed in SGLang's real pools (or SGLang's exception, exactly)."""
    proc = subprocess.run([python, str(CHILD), str(model_dir), json.dumps(settings)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    line = next((l for l in proc.stdout.splitlines() if l.startswith(MARK)), None)
    if line is None:
        return {"ok": False, "error": {"class": "ChildFailed", "message": (proc.stderr or "")[-2000:]}}
    return json.loads(line[len(MARK):])


def invariants(seen: dict[str, Any], layers: Sequence[LayerPlan]) -> dict[str, Any]:
    """The invariants as data: each a list of the layers (or pools) that break it, empty when it holds."""
    planned = {l.index: (l.extra["pool"], l.extra["pool_index"]) for l in layers if "pool" in l.extra}
    landed = {int(k): v for k, v in seen["layers"].items()}
    reach, alias = [], []
    by_pool: dict[str, list[int]] = {}
    ptrs: dict[int, int] = {}
    for layer, info in sorted(landed.items()):
        hits = [tuple(h) for h in info["hits"]]
        if hits != [planned.get(layer)]:
            reach.append({"layer": layer, "planned": planned.get(layer), "landed": hits})
        if info["ptr"] in ptrs:
            alias.append({"layer": layer, "same_buffer_as": ptrs[info["ptr"]]})
        ptrs[info["ptr"]] = layer
        for pool, index in hits:
            by_pool.setdefault(pool, []).append(index)
    missing = sorted(set(planned) - set(landed))
    dense = [{"pool": pool, "indices": sorted(ix)} for pool, ix in by_pool.items()
             if sorted(ix) != list(range(len(ix)))]
    return {"reach": reach, "unplanned_or_missing": missing, "aliasing": alias, "dense": dense}


def startup_agreement(seen: dict[str, Any], refusals: Sequence[Any]) -> dict[str, Any]:
    """The dry run's outcome beside the static plan's: a stale plan is one that disagrees.

    The child runs SGLang's own start-up (ServerArgs resolution, ModelConfig, the pool configurator and the
    pool classes) on the model directory, so its exception, class and text, is what the server would print
    at start-up (up to model load: the window SGLang resolves at load time, SGL003, is not reached)."""
    engine = None if seen.get("ok") else (seen["error"]["class"], seen["error"]["message"])
    static = (refusals[0].error_class, refusals[0].message) if refusals else None
    return {"engine": engine, "plan": static, "agree": engine == static}
