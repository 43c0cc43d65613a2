"""The catalog of known errors: `rules/CODE.yaml`, one entry a file, validated on load."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvdoctor.errors import InputError
from kvdoctor.yamlfile import load_validated

CODE_RE = re.compile(r"^[A-Z]{2,5}[0-9]{3}$")
SITE_RE = re.compile(r"^[\w./-]+\.py:\d+ @ [\w.+-]+$")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_ENTRY_BYTES = 256 * 1024

# A reference is public: an engine source link pinned to a release tag or a commit, an issue or pull
# request as owner/repo#N, or one of kvdoctor's own docs. Free text may follow the first word.
PINNED_URL_RE = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(?:blob|tree)/(?:v?\d[\w.+-]*|[0-9a-f]{7,40})/\S+$")
THREAD_RE = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")
DOCS_RE = re.compile(r"^docs/[\w./-]+\.md(?:#[\w-]+)?$")


def reference_problem(reference: str) -> str | None:
    """Why `reference` is not a public reference, or None when it is one."""
    head = reference.split()[0] if reference.strip() else ""
    if PINNED_URL_RE.match(head) or THREAD_RE.match(head) or DOCS_RE.match(head):
        return None
    if head.startswith("https://github.com/"):
        return f"{head}: a source link must be pinned to a release tag or a commit, not a branch"
    return (f"{reference!r} is not a public reference: use a pinned source URL, owner/repo#N or docs/...")


def _compile(value: str, what: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{what} does not compile: {exc}") from None
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ENGINE_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")  # vllm, sglang, sglang-mlx, mlx-lm, hf ...


class EngineRange(_Strict):
    name: str
    versions: str = Field(description="a version specifier such as '>=0.10,<0.34' or '==0.5.23'")

    @field_validator("name")
    @classmethod
    def _engine(cls, value: str) -> str:
        if not ENGINE_NAME_RE.match(value):
            raise ValueError("engine name must be a lower-case package name such as vllm, sglang or mlx-lm")
        return value

    @field_validator("versions")
    @classmethod
    def _specifier(cls, value: str) -> str:
        try:
            spec = SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(f"versions {value!r} is not a version specifier such as '>=0.10,<0.34'") from None
        if not str(spec):
            raise ValueError("versions must state a range, e.g. '>=0.10,<0.34' or '==0.5.23'")
        return value

    def contains(self, version: str) -> bool:
        return SpecifierSet(self.versions).contains(version, prereleases=True)


class EngineErrorFact(_Strict):
    class_: str = Field(alias="class")
    message: str = Field(description="the newest wording, verbatim; {name} where the engine fills a value in")
    pattern: str
    patterns: list[str] = Field(default_factory=list, description="older or other wordings of the same error")
    source: str = Field(description="file:line at a version, verbatim from the engine")
    sites: list[str] = Field(default_factory=list, description="file:line @ version at other releases: "
                             "a traceback that ends in a bare assertion is matched on its raising frame")
    context: list[str] = Field(default_factory=list, description="for generic errors (CUDA asserts): the "
                               "entry is named only when each of these matches a nearby line")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        return _compile(value, "pattern")

    @field_validator("patterns", "context")
    @classmethod
    def _all_compile(cls, values: list[str]) -> list[str]:
        return [_compile(v, "pattern") for v in values]

    @field_validator("sites")
    @classmethod
    def _sites(cls, values: list[str]) -> list[str]:
        for value in values:
            if not SITE_RE.match(value):
                raise ValueError(f"site {value!r} must read 'path/file.py:LINE @ VERSION'")
        return values

    @property
    def all_patterns(self) -> list[str]:
        return [self.pattern, *self.patterns]


class Fix(_Strict):
    summary: str
    before: Optional[str] = None
    after: Optional[str] = None


class Entry(_Strict):
    code: str
    name: str
    severity: Literal["error", "warning", "info"]
    summary: str
    engines: list[EngineRange] = Field(min_length=1)
    error: Optional[EngineErrorFact] = None
    meaning: str
    triggers: list[str]
    fixes: list[Fix] = Field(min_length=1)
    prevention: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    check: str = Field(description="the module that implements the check, or 'none yet'")
    prevented_by: list[str] = Field(default_factory=list, description="codes of `kvdoctor check` findings "
                                    "that catch the cause of this error before deploy")

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

    @field_validator("references")
    @classmethod
    def _public(cls, values: list[str]) -> list[str]:
        for value in values:
            problem = reference_problem(value)
            if problem:
                raise ValueError(problem)
        return values

    @field_validator("prevented_by")
    @classmethod
    def _codes(cls, values: list[str]) -> list[str]:
        for value in values:
            if not CODE_RE.match(value):
                raise ValueError(f"prevented_by lists codes such as MEM001, not {value!r}")
        return values

    @property
    def preventers(self) -> list[str]:
        """The check codes that catch this before deploy: the entry itself when a check implements it."""
        own = [self.code] if self.implemented else []
        return own + [c for c in self.prevented_by if c != self.code]

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
