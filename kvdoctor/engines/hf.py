"""`hf`: the model's own meaning (transformers semantics); every window applies as declared."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kvdoctor.context import EnginePlan
from kvdoctor.model import ATTENTION_KINDS, SLIDING, CHUNKED, LayerPlan, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.deploy import Deploy


def cache_kind(kind: str) -> str:
    if kind in (SLIDING, CHUNKED):
        return "windowed"
    if kind in ATTENTION_KINDS:
        return "full"
    return "state"


def plan(spec: ModelSpec, deploy: Deploy) -> EnginePlan:
    layers = [LayerPlan(index=l.index, engine_window=l.window, cache=cache_kind(l.kind)) for l in spec.layers]
    return EnginePlan(engine="hf", versions={}, layers=layers)
