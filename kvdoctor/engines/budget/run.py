"""One budget run, the part every engine shares: the context, the memory each engine gets, and the
JSON document. The modes and the sizing are each engine profile's (`budget.py` in its package).

The memory left for KV caches after weights is profiled on the GPU by the engines themselves, so
it is an input (`kv_budget`). Given a GPU size instead, kvdoctor estimates it from the weight
bytes in the checkpoint headers, through the engine's own reservation, and labels the result an
estimate.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from kvdoctor.engines.budget.common import Budget
from kvdoctor.engines.budget.facts import ModelFacts
from kvdoctor.engines.budget.settings import BudgetSettings, parse_size
from kvdoctor.errors import InputError
from kvdoctor.model import ModelSpec

# (GPU bytes, weight bytes per rank) -> (bytes the engine leaves for KV caches and state, how)
Usable = Callable[[int, int], tuple[int, str]]


def default_context(facts: ModelFacts, settings: BudgetSettings) -> int:
    if settings.context:
        return settings.context
    if isinstance(facts.max_position, int) and facts.max_position > 0:
        return facts.max_position
    raise InputError(f"{facts.name}: config.json names no maximum context (max_position_embeddings, "
                     "model_max_length, ...); give --context")


def kv_memory(engine: str, facts: ModelFacts, settings: BudgetSettings, usable: Usable,
              tp: int = 1) -> tuple[int, dict[str, Any]]:
    """(bytes for KV and state on one rank, how that figure was obtained). `usable` is the engine's own
    reservation: what it leaves of a GPU of that size after the weights."""
    if settings.kv_budget is not None:
        size = parse_size(settings.kv_budget, "kv budget")
        return size, {"source": "user", "kv_budget_bytes": size}
    if settings.gpu_memory is None:
        raise InputError("give the memory left for KV caches (--kv-budget 40GiB, or budget.kv_budget in the "
                         "deploy file) or a GPU size to estimate it from (--gpu-memory 141GiB)")
    gpu = parse_size(settings.gpu_memory, "gpu memory")
    if not facts.weights_bytes:
        raise InputError(f"{facts.name}: --gpu-memory needs the checkpoint's safetensors headers to count the "
                         "weights, and this model directory has none; give --kv-budget instead")
    weights = facts.weights_bytes // tp
    size, how = usable(gpu, weights)
    if size <= 0:
        raise InputError(f"{facts.name}: the weights ({weights} B per rank) leave no memory for KV caches on a "
                         f"{gpu} B GPU under {engine}'s reservation")
    return size, {"source": "estimated", "kv_budget_bytes": size, "gpu_memory_bytes": gpu,
                  "weights_bytes": weights, "how": how}


def plan_engine(engine: str, facts: ModelFacts, config: dict[str, Any], inputs: BudgetSettings, settings: BaseModel,
                all_modes: bool) -> tuple[Sequence[Budget], dict[str, Any]]:
    """One engine's budgets: its profile's model, with its deploy section."""
    from kvdoctor.engines import profile

    return profile(engine).budget(facts, config, settings, inputs, all_modes)


def document(spec: ModelSpec, facts: ModelFacts, results: dict[str, tuple[Sequence[Budget], dict]],
             settings: BudgetSettings, findings: dict[str, list[list[dict]]],
             not_priced: dict[str, str] | None = None) -> dict[str, Any]:
    """The budget JSON; `not_priced`: the engines of `--engine all` that cannot size this model, and why."""
    raw = (spec.model_dir / "config.json").read_bytes()
    kinds = dict(facts.kinds())
    engines = []
    for engine, (budgets, how) in results.items():
        for i, b in enumerate(budgets):
            row = b.to_json()
            row["budget"] = how
            row["findings"] = findings.get(engine, [[]] * len(budgets))[i]
            engines.append(row)
    return {
        "schema": "kvdoctor.budget/1",
        "model": {"id": facts.name, "target": spec.target, "model_type": facts.model_type,
                  "config_sha256": hashlib.sha256(raw).hexdigest(), "layers": len(facts.layers),
                  "layer_kinds": kinds, "windows": sorted(facts.windows),
                  "weights_bytes": facts.weights_bytes, "source": spec.origin or {"kind": "directory"}},
        "inputs": {"context": default_context(facts, settings), "kv_budget": settings.kv_budget,
                   "gpu_memory": settings.gpu_memory},
        "engines": engines,
        "not_priced": [{"engine": name, "why": why} for name, why in (not_priced or {}).items()],
    }
