"""`hf`: the model's own meaning (transformers semantics); every window applies as declared."""
from __future__ import annotations

from typing import ClassVar, Mapping

from pydantic import BaseModel

from kvdoctor.deploy import Section
from kvdoctor.engines.base import EngineProfile, LayerPlan, Plan
from kvdoctor.model import ATTENTION_KINDS, CHUNKED, SLIDING, ModelSpec


def cache_kind(kind: str) -> str:
    if kind in (SLIDING, CHUNKED):
        return "windowed"
    if kind in ATTENTION_KINDS:
        return "full"
    return "state"


class HfSettings(Section):
    """Nothing to set: the reference has no start-up options."""


class HfProfile(EngineProfile):
    name = "hf"
    pins: ClassVar[Mapping[str, str]] = {}
    Settings = HfSettings
    reference = True

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[None]:
        layers = tuple(LayerPlan(index=l.index, engine_window=l.window, cache=cache_kind(l.kind))
                       for l in spec.layers)
        return Plan(engine="hf", versions={}, layers=layers)
