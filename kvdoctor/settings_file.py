"""The keys a config file (`[tool.kvdoctor]` or kvdoctor.toml) may hold, as a pydantic model.

Imported only when a config file is read: without one, settings.py uses NO_FILE and a static
check never imports pydantic.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["error", "warning", "info"]


class FileSettings(BaseModel):
    """The keys a config file may hold (kebab-case, as ruff spells them)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    select: Optional[list[str]] = None
    extend_select: list[str] = Field(default_factory=list, alias="extend-select")
    ignore: list[str] = Field(default_factory=list)
    per_model_ignores: dict[str, list[str]] = Field(default_factory=dict, alias="per-model-ignores")
    severity: dict[str, Severity] = Field(default_factory=dict)
    engine: Optional[str] = None
    deploy: Optional[str] = None
    fail_on: Optional[Severity] = Field(None, alias="fail-on")
