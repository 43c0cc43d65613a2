"""The engine releases kvdoctor describes, by distribution name: the only place each is written.

`PROFILED` lists every release a profile knows, oldest first; what differs between them is data with a
release range in each engine's package (`kvdoctor.engines.releases.Ranged`). `PINS` is the release a check
describes when none is named and none is installed, and the one the catalog's single-release entries
(`versions: ==X`) are written for. Each goldens file records the release that made it, and the tests hold the
profile at that release to its points (goldens/vllm.json and vllm_check.json: vLLM 0.33.0's full grids;
goldens/vllm-<release>.json and vllm_check-<release>.json: each release's own). Profiles take their `pins`
from here, and so do the budget models, the dry run and the reports. A separate module rather than a constant
in one profile because two profiles describe the same sglang release (its CUDA side and its MLX backend) and
the budget modules import the pins without importing a profile.
"""
from __future__ import annotations

PROFILED: dict[str, tuple[str, ...]] = {
    "vllm": ("0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"),
    "sglang": ("0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
               "0.5.23"),
    "mlx-lm": ("0.32.2",),
}

PINS: dict[str, str] = {
    "sglang": "0.5.23",
    "vllm": "0.34.0",
    "mlx-lm": "0.32.2",
}
