"""The keys a config file (`[tool.kvdoctor]` or kvdoctor.toml) may hold, as a pydantic model.

Imported only when a config file is read: without one, settings.py uses NO_FILE and a static
check never imports pydantic.
"""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from kvdoctor.model import Severity
from kvdoctor.load.strict import Name


class FileSettings(BaseModel):
    """The keys a config file may hold (kebab-case, as ruff spells them)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    select: Optional[list[str]] = None
    extend_select: list[str] = Field(default_factory=list, alias="extend-select")
    ignore: list[str] = Field(default_factory=list)
    per_model_ignores: dict[str, list[str]] = Field(default_factory=dict, alias="per-model-ignores")
    severity: dict[str, Severity] = Field(default_factory=dict)
    engine: Optional[Name] = None  # an empty name is refused, not taken as "unset"
    deploy: Optional[Name] = None
    fail_on: Optional[Severity] = Field(None, alias="fail-on")
    targets: Optional[list[str]] = None  # what `kvdoctor check` checks when the command line names nothing
