"""The schema of a catalog entry (`rules/CODE.yaml`), as pydantic models.

Imported only when an entry is parsed (catalog.py reads entries lazily), so a check that finds
nothing never imports pydantic.
"""
from __future__ import annotations

import re
from typing import Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from kvdoctor.catalog.codes import CODE_RE, NAME_RE, reference_problem
from kvdoctor.model import Severity

SITE_RE = re.compile(r"^[\w./-]+\.py:\d+ @ [\w.+-]+$")
FUNCTION_RE = re.compile(r"^[\w./-]+\.py in \w+$")
STATEMENT_RE = re.compile(r"^[\w./-]+\.py in \w+: (?:raise|assert)\b.+$")
# The forms of the source lists an engine error may carry: field -> (its form, what one item is, how it must read)
SOURCE_FORMS = {"sites": (SITE_RE, "site", "'path/file.py:LINE @ VERSION'"),
                "functions": (FUNCTION_RE, "function", "'path/file.py in function_name'"),
                "statements": (STATEMENT_RE, "statement", "'path/file.py in function_name: raise ...' (or assert)")}


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
    functions: list[str] = Field(default_factory=list, description="for a bare assert: 'path/file.py in name', a "
                                 "function whose every bare assert is this statement at each release read; a "
                                 "traceback frame in it names the entry at any line")
    statements: list[str] = Field(default_factory=list, description="'path/file.py in name: first line', the "
                                  "first source line of a raise or assert of this entry in that function, where "
                                  "at each release read every raise and assert of the function beginning with "
                                  "that line is this entry's: a traceback cut at that frame names the entry")
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

    @field_validator("sites", "functions", "statements")
    @classmethod
    def _source_form(cls, values: list[str], info: ValidationInfo) -> list[str]:
        form, item, reads = SOURCE_FORMS[str(info.field_name)]
        for value in values:
            if not form.match(value):
                raise ValueError(f"{item} {value!r} must read {reads}")
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
    severity: Severity
    summary: str
    engines: list[EngineRange] = Field(min_length=1)
    error: Optional[EngineErrorFact] = None
    meaning: str
    triggers: list[str]
    fixes: list[Fix] = Field(min_length=1)
    prevention: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
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
    def family(self) -> str:
        return self.code.rstrip("0123456789")

