"""The schema of a catalog entry (`rules/CODE.yaml`), as pydantic models.

Imported only when an entry is parsed (catalog.py reads entries lazily), so a check that finds
nothing never imports pydantic.
"""
from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvdoctor.catalog import CODE_RE, NAME_RE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineRange(_Strict):
    name: str
    versions: str = Field(description="a version specifier such as '>=0.5.23' or '==0.5.23'")


class EngineErrorFact(_Strict):
    class_: str = Field(alias="class")
    message: str
    pattern: str
    source: str = Field(description="file:line at a version, verbatim from the engine")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"pattern does not compile: {exc}") from None
        return value


class Fix(_Strict):
    summary: str
    before: Optional[str] = None
    after: Optional[str] = None


class Entry(_Strict):
    code: str
    name: str
    severity: Literal["error", "warning", "info"]
    summary: str
    engines: list[EngineRange]
    error: Optional[EngineErrorFact] = None
    meaning: str
    triggers: list[str]
    fixes: list[Fix] = Field(min_length=1)
    prevention: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    check: str = Field(description="the module that implements the check, or 'none yet'")

    @field_validator("code")
    @classmethod
    def _code(cls, value: str) -> str:
        if not CODE_RE.match(value):
            raise ValueError("code must be 2-5 capital letters and 3 digits, e.g. SWA001")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("name must be kebab-case")
        return value

    @property
    def family(self) -> str:
        return self.code.rstrip("0123456789")

    @property
    def implemented(self) -> bool:
        return self.check != "none yet"
