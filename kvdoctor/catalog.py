"""The catalog of known errors: `rules/CODE.yaml`, one entry a file, validated on load."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from kvdoctor.errors import InputError

if TYPE_CHECKING:
    from kvdoctor.catalog_schema import Entry

CODE_RE = re.compile(r"^[A-Z]{2,5}[0-9]{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_ENTRY_BYTES = 256 * 1024


def default_catalog_dir() -> Path:
    """`rules/` beside the package in a checkout, or the copy installed as package data."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "rules", here / "data" / "rules"):
        if candidate.is_dir():
            return candidate
    raise InputError(f"kvdoctor's catalog directory is missing (looked in {here.parent / 'rules'})")


SCHEMA_NAMES = ("Entry", "EngineRange", "EngineErrorFact", "Fix")


def __getattr__(name: str):
    """The schema's models, imported on first use (`from kvdoctor.catalog import Entry` still works)."""
    if name in SCHEMA_NAMES:
        from kvdoctor import catalog_schema

        return getattr(catalog_schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_entry(path: Path) -> Entry:
    from kvdoctor.catalog_schema import Entry
    from kvdoctor.yamlfile import load_validated

    entry, _ = load_validated(path, Entry, "catalog entry", MAX_ENTRY_BYTES)
    if path.stem != entry.code:
        raise InputError(f"{path}: file name must be the entry's code ({entry.code}.yaml)")
    return entry


class Catalog:
    """Entries by code. Built-in entries are parsed on first use: a check that finds nothing reads
    only the file names, so a static check stays fast (the tests validate every built-in entry)."""

    def __init__(self, paths: dict[str, Path], loaded: dict[str, Entry] | None = None,
                 builtin: frozenset[str] = frozenset()):
        self.paths = paths
        self._loaded = dict(loaded or {})
        self.builtin = builtin  # codes of kvdoctor's own entries

    def get(self, code: str) -> Entry | None:
        if code not in self._loaded:
            path = self.paths.get(code)
            if path is None:
                return None
            self._loaded[code] = load_entry(path)
        return self._loaded[code]

    def brief(self, code: str) -> tuple[str, str, list[str]] | None:
        """(name, severity, fix summaries): what a finding carries. A built-in entry not yet parsed
        is read with the bounded YAML loader alone, not validated (the tests validate every built-in
        entry against the schema), so a check with findings still imports no pydantic."""
        if code in self._loaded:
            entry = self._loaded[code]
            return entry.name, entry.severity, [fix.summary for fix in entry.fixes]
        path = self.paths.get(code)
        if path is None:
            return None
        if code not in self.builtin:
            entry = self[code]
            return entry.name, entry.severity, [fix.summary for fix in entry.fixes]
        from kvdoctor.yamlfile import load_yaml

        data, _ = load_yaml(path, "catalog entry", MAX_ENTRY_BYTES)
        return data["name"], data["severity"], [fix["summary"] for fix in data["fixes"]]

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
    builtin: set[str] = set()
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
            elif directory is None:
                builtin.add(path.stem)
    return Catalog(paths, loaded, frozenset(builtin))


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    return load_catalog()
