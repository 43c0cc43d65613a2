"""The catalog of known errors: `rules/CODE.yaml`, one entry a file, validated on load."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvdoctor.errors import InputError
from kvdoctor.yamlfile import load_validated

CODE_RE = re.compile(r"^[A-Z]{2,5}[0-9]{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_ENTRY_BYTES = 256 * 1024


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


def default_catalog_dir() -> Path:
    """The built-in catalog: shipped in the package, or `rules/` at the root of a checkout."""
    from kvdoctor.resources import catalog_dir

    return catalog_dir()


def load_entry(path: Path) -> Entry:
    entry, _ = load_validated(path, Entry, "catalog entry", MAX_ENTRY_BYTES)
    if path.stem != entry.code:
        raise InputError(f"{path}: file name must be the entry's code ({entry.code}.yaml)")
    return entry


class Catalog:
    """Entries by code. Built-in entries are parsed on first use: a check that finds nothing reads
    only the file names, so a static check stays fast (the tests validate every built-in entry)."""

    def __init__(self, paths: dict[str, Path], loaded: dict[str, Entry] | None = None):
        self.paths = paths
        self._loaded = dict(loaded or {})

    def get(self, code: str) -> Entry | None:
        if code not in self._loaded:
            path = self.paths.get(code)
            if path is None:
                return None
            self._loaded[code] = load_entry(path)
        return self._loaded[code]

    def __getitem__(self, code: str) -> Entry:
        entry = self.get(code)
        if entry is None:
            raise KeyError(code)
        return entry

    def codes(self) -> list[str]:
        return sorted(self.paths)

    @property
    def entries(self) -> dict[str, Entry]:
        return {code: self[code] for code in self.codes()}


def load_catalog(directory: Path | None = None, extra_dirs: tuple[Path, ...] = ()) -> Catalog:
    """The catalog of `directory` (default: the built-in one), read lazily, plus user directories,
    which are validated whole here so that a bad user entry fails before any check runs."""
    paths: dict[str, Path] = {}
    loaded: dict[str, Entry] = {}
    folders = [(directory or default_catalog_dir(), False)] + [(d, True) for d in extra_dirs]
    for folder, eager in folders:
        if not folder.is_dir():
            raise InputError(f"{folder}: catalog directory not found")
        for path in sorted(folder.glob("*.yaml")):
            if not CODE_RE.match(path.stem):
                raise InputError(f"{path}: catalog files are named CODE.yaml, e.g. SWA001.yaml")
            if path.stem in paths:
                raise InputError(f"{path}: duplicate catalog code {path.stem}")
            paths[path.stem] = path
            if eager:
                loaded[path.stem] = load_entry(path)
    return Catalog(paths, loaded)


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    return load_catalog()
