"""The catalog of known errors: `rules/CODE.yaml`, one entry a file, validated on load."""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import msgspec

from kvdoctor.catalog.codes import CODE_RE
from kvdoctor.errors import InputError

if TYPE_CHECKING:
    from kvdoctor.model import Finding
    from kvdoctor.catalog.schema import Entry

MAX_ENTRY_BYTES = 256 * 1024
# Beside the built-in entries: each one's (name, severity, fix summaries), what a finding carries, so
# that a check with findings parses no YAML. Written by `make briefs`; a test holds it to the entries.
BRIEFS_NAME = "briefs.json"
# And each one's Description, what the SARIF, JUnit and HTML reports say of a rule, so that they too
# parse no YAML and import no pydantic (350 entries through both took 0.35 s of a SARIF report).
DESCRIPTIONS_NAME = "descriptions.json"

def default_catalog_dir() -> Path:
    """The built-in catalog: shipped in the package, or `rules/` at the root of a checkout."""
    from kvdoctor.resources import catalog_dir

    return catalog_dir()


SCHEMA_NAMES = ("Entry", "EngineRange", "EngineErrorFact", "Fix")


def __getattr__(name: str):
    """The schema's models, imported on first use (`from kvdoctor.catalog import Entry` still works)."""
    if name in SCHEMA_NAMES:
        from kvdoctor.catalog import schema as catalog_schema

        return getattr(catalog_schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_entry(path: Path) -> Entry:
    from kvdoctor.catalog.schema import Entry
    from kvdoctor.load.yamlfile import load_validated

    entry, _ = load_validated(path, Entry, "catalog entry", MAX_ENTRY_BYTES)
    if path.stem != entry.code:
        raise InputError(f"{path}: file name must be the entry's code ({entry.code}.yaml)")
    return entry


class FixExample(msgspec.Struct, frozen=True):
    summary: str
    before: str | None = None
    after: str | None = None


class ErrorText(msgspec.Struct, frozen=True):
    class_: str = msgspec.field(name="class")
    message: str


class Description(msgspec.Struct, frozen=True):
    """What the reports say of a catalog entry: its texts, fixes with their examples, the engine's
    error and the references."""
    code: str
    name: str
    severity: str
    summary: str
    meaning: str
    fixes: list[FixExample]
    error: ErrorText | None = None
    references: list[str] = msgspec.field(default_factory=list)
    tags: list[str] = msgspec.field(default_factory=list)

    @property
    def family(self) -> str:
        return self.code.rstrip("0123456789")


def describe(entry: Entry) -> Description:
    error = ErrorText(entry.error.class_, entry.error.message) if entry.error else None
    return Description(entry.code, entry.name, entry.severity, entry.summary, entry.meaning,
                       [FixExample(f.summary, f.before, f.after) for f in entry.fixes], error,
                       list(entry.references), list(entry.tags))


class Catalog:
    """Entries by code. Built-in entries are parsed on first use: a check that finds nothing reads
    only the file names, so a static check stays fast (the tests validate every built-in entry)."""

    def __init__(self, paths: dict[str, Path], loaded: dict[str, Entry] | None = None,
                 builtin: frozenset[str] = frozenset()):
        self.paths = paths
        self._loaded = dict(loaded or {})
        self.builtin = builtin  # codes of kvdoctor's own entries
        self._briefs: dict[str, list] | None = None
        self._descriptions: dict[str, Description] | None = None

    def get(self, code: str) -> Entry | None:
        if code not in self._loaded:
            path = self.paths.get(code)
            if path is None:
                return None
            self._loaded[code] = load_entry(path)
        return self._loaded[code]

    def complete(self, finding: Finding, severity_overrides: Mapping[str, str] | None = None) -> Finding:
        """Attach the entry's name, severity and fixes to a finding a rule produced (a --severity
        override, then the rule's own severity, beat the entry's)."""
        brief = self.brief(finding.code)
        if brief is None:
            raise RuntimeError(f"rule emitted {finding.code}, which has no catalog entry")
        name, severity, fixes = brief
        finding.name = name
        finding.severity = (severity_overrides or {}).get(finding.code) or finding.severity or severity
        if not finding.fixes:
            finding.fixes = fixes
        return finding

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
        if self._briefs is None:
            index = path.parent / BRIEFS_NAME
            self._briefs = json.loads(index.read_text(encoding="utf-8")) if index.is_file() else {}
        if code in self._briefs:
            name, severity, fixes = self._briefs[code]
            return name, severity, fixes
        from kvdoctor.load.yamlfile import load_yaml

        data, _ = load_yaml(path, "catalog entry", MAX_ENTRY_BYTES)
        return data["name"], data["severity"], [fix["summary"] for fix in data["fixes"]]

    def description(self, code: str) -> Description | None:
        """The entry's Description: for a built-in entry from the descriptions index (held to the
        entries by a test), else, or where the index lacks the code, from the validated entry."""
        if code in self.builtin and code not in self._loaded:
            if self._descriptions is None:
                index = self.paths[code].parent / DESCRIPTIONS_NAME
                self._descriptions = (msgspec.json.decode(index.read_bytes(), type=dict[str, Description])
                                      if index.is_file() else {})
            if code in self._descriptions:
                return self._descriptions[code]
        entry = self.get(code)
        return describe(entry) if entry is not None else None

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
        # file names sorted as strings: the order sorted Paths would give, without a Path per file
        for name in sorted(n for n in os.listdir(folder) if n.endswith(".yaml")):
            code, path = name[:-len(".yaml")], folder / name
            if not CODE_RE.match(code):
                raise InputError(f"{path}: catalog files are named CODE.yaml, e.g. SWA001.yaml")
            if code in paths:
                raise InputError(f"{path}: duplicate catalog code {code}")
            paths[code] = path
            if eager:
                loaded[code] = load_entry(path)
            elif directory is None:
                builtin.add(code)
    return Catalog(paths, loaded, frozenset(builtin))


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    return load_catalog()


def briefs(catalog: Catalog) -> dict[str, list]:
    """The briefs index of a catalog: code -> [name, severity, [fix summaries]]."""
    return {code: [entry.name, entry.severity, [fix.summary for fix in entry.fixes]]
            for code, entry in catalog.entries.items()}


def descriptions(catalog: Catalog) -> dict[str, Description]:
    """The descriptions index of a catalog: code -> Description."""
    return {code: describe(entry) for code, entry in catalog.entries.items()}


def write_briefs() -> list[Path]:
    """Rewrite the built-in catalog's briefs and descriptions indexes from its entries (`make briefs`)."""
    catalog, folder = load_catalog(), default_catalog_dir()
    briefs_path, descriptions_path = folder / BRIEFS_NAME, folder / DESCRIPTIONS_NAME
    briefs_path.write_text(json.dumps(briefs(catalog), indent=0, sort_keys=True, ensure_ascii=False) + "\n",
                           encoding="utf-8")
    lines = [msgspec.json.encode(code) + b": " + msgspec.json.encode(d) for code, d in descriptions(catalog).items()]
    descriptions_path.write_bytes(b"{\n" + b",\n".join(lines) + b"\n}\n")  # an entry a line, for diffs
    return [briefs_path, descriptions_path]
