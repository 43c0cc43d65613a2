"""What a rule sees, frozen: the spec, the engine's plan and deploy section, and what the probes observed.
Rules never reload files, build caches or write into any of it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

import msgspec

from kvdoctor.engines.base import Plan
from kvdoctor.model import ModelSpec

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kvdoctor.engines.deploy import Deploy


class Context(msgspec.Struct, frozen=True):
    spec: ModelSpec
    engine: str
    deploy: Deploy
    plan: Plan[object]
    settings: Optional[BaseModel] = None  # the engine profile's deploy section; None: read from `deploy`
    observations: Mapping[str, object] = msgspec.field(default_factory=dict)  # probe name (or "dry_run") -> observation
    options: Mapping[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.settings is None:
            msgspec.structs.force_setattr(self, "settings", self.deploy.settings(self.engine))
