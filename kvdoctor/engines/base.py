"""The seam every engine profile implements, and the typed, frozen plan it returns.

Data flows one way: load -> `EngineProfile.plan` (static, no torch / mlx) -> the probes the selected
rules need -> rules (read spec, plan and observations; return findings) -> `EngineProfile.report`.
Nothing downstream writes into a plan; a probe returns observations, never catalog codes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Mapping, Sequence, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kvdoctor.model import ModelSpec

STAGES = ("load", "startup", "prefill", "decode")


@dataclass(frozen=True)
class Refusal:
    """An error the engine will raise for this model and these settings, predicted without running it."""

    code: str  # the catalog entry that explains it
    error_class: str  # the exception class, as the engine names it
    message: str  # the exact text the engine prints, numbers filled in
    stage: str  # one of STAGES
    layer: int | None = None
    key: str | None = None  # the config key or deploy setting at fault, for location and fingerprint
    source: str | None = None  # where the engine raises it: a pinned source URL or file:line @ version
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LayerPlan:
    """What one engine will do with one layer."""

    index: int
    engine_window: int | None  # keys attended including the query's own (the `window` convention); None: full
    cache: str  # kvdoctor's label for the cache the engine builds: full, windowed, mla, state, ...
    state: Mapping[str, Any] | None = None  # recurrent-state shapes and bytes, by TP size
    extra: Mapping[str, Any] = field(default_factory=dict)  # engine-specific JSON fields: engine_spec, pool_index


FactsT = TypeVar("FactsT")


@dataclass(frozen=True)
class Plan(Generic[FactsT]):
    engine: str
    versions: Mapping[str, str]
    layers: tuple[LayerPlan, ...]
    refusals: tuple[Refusal, ...] = ()
    facts: FactsT | None = None  # a frozen dataclass of the profile's own: pools, groups, fused kernels
    notes: tuple[str, ...] = ()


class EngineProfile(ABC):
    """One engine at the versions in `pins`. Register it in `kvdoctor.engines.PROFILES`."""

    name: ClassVar[str]
    pins: ClassVar[Mapping[str, str]]  # {"vllm": "0.33.0"}: the only place an engine version is written
    Settings: ClassVar[type[BaseModel]]  # its deploy-file section (named `name` with - as _)

    @abstractmethod
    def plan(self, spec: ModelSpec, settings: Any) -> Plan[Any]:
        """How the engine lays out this model's caches and what it refuses; imports no torch or mlx."""

    def probes(self) -> Sequence[Any]:
        """Probes that build and drive real caches for this engine (none by default)."""
        return ()

    def report(self, plan: Plan[Any], observations: Mapping[str, Any]) -> dict[str, Any]:
        """The engine's part of the JSON `info`, from the plan and what the probes observed."""
        return {}
