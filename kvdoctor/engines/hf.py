"""`hf`: the model's own meaning (transformers semantics); every window applies as declared."""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from kvdoctor.engines.base import EngineProfile, LayerPlan, Plan
from kvdoctor.model import ATTENTION_KINDS, CHUNKED, SLIDING, ModelSpec

if TYPE_CHECKING:
    from pydantic import BaseModel


def cache_kind(kind: str) -> str:
    if kind in (SLIDING, CHUNKED):
        return "windowed"
    if kind in ATTENTION_KINDS:
        return "full"
    return "state"


@lru_cache(maxsize=1)
def settings_class() -> type[BaseModel]:
    """HfSettings, defined on first use: the reference reads no setting, so a static check of it
    without a deploy file never imports pydantic (deploy.Section is a pydantic model)."""
    from kvdoctor.engines.deploy import Section

    class HfSettings(Section):
        """Nothing to set: the reference has no start-up options."""

    return HfSettings


class _SettingsClass:
    """`HfProfile.Settings`, read as a class attribute like every profile's."""

    def __get__(self, obj: Any, owner: Any) -> type[BaseModel]:
        return settings_class()


class HfProfile(EngineProfile):
    name = "hf"
    pins: ClassVar[Mapping[str, str]] = {}
    Settings = _SettingsClass()
    reference = True

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[None]:
        layers = tuple(LayerPlan(index=l.index, engine_window=l.window, cache=cache_kind(l.kind))
                       for l in spec.layers)
        return Plan(engine="hf", versions={}, layers=layers)
