"""Engine profiles. Each module has `plan(spec, deploy) -> EnginePlan`: how that engine, at the
version the profile describes, lays out caches for this model. Imported only when chosen."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kvdoctor.context import EnginePlan
from kvdoctor.errors import InputError
from kvdoctor.model import ModelSpec

if TYPE_CHECKING:
    from kvdoctor.deploy import Deploy

ENGINES: dict[str, str] = {
    "hf": "kvdoctor.engines.hf",
    "sglang-mlx": "kvdoctor.engines.sglang_mlx",  # issue 3: sglang 0.5.23 MLX backend + mlx-lm 0.32.2
    "sglang": "kvdoctor.engines.sglang",  # issue 4: sglang 0.5.23 CUDA side, KDA ReplaySSM state caches
}


def plan_for(engine: str, spec: ModelSpec, deploy: Deploy) -> EnginePlan:
    module = ENGINES.get(engine)
    if module is None:
        raise InputError(f"unknown engine {engine!r}; expected one of: {', '.join(sorted(ENGINES))}")
    return importlib.import_module(module).plan(spec, deploy)
