"""What a rule sees: the spec, the engine plan and what the probes observed. Rules never reload files."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvdoctor.model import LayerPlan, ModelSpec


@dataclass
class EnginePlan:
    engine: str
    versions: dict[str, str]
    layers: list[LayerPlan]
    data: dict[str, Any] = field(default_factory=dict)  # engine-specific facts rules may read


@dataclass
class Context:
    spec: ModelSpec
    engine: str
    deploy: Any  # kvdoctor.deploy.Deploy
    plan: EnginePlan
    options: dict[str, Any] = field(default_factory=dict)
