"""Deploy settings (`--deploy deploy.yaml`): what the engines will be started with.

One section per registered engine profile, named after it (`sglang-mlx` -> `sglang_mlx:`) and
validated by that profile's `Settings` model; `check` and `budget` read the same section, so a knob
has one name and one default. Top level: `engine`, `engine_version` (the
release of that engine the file describes), `context_length` and `budget:` (the memory and
context a budget is sized for). The old spelling of the engine knobs under `budget:` (`budget.vllm`,
`budget.sglang` with `tp`, `budget.mlx_lm`) is still read, with a warning, and reported at its own
line under its own name.

Unknown keys and wrong types are refused with the file, line and field; YAML tags that would build
objects are refused by the safe loader. Every setting has the engine's own default.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from kvdoctor.engines.budget.settings import BudgetSettings
from kvdoctor.engines.releases import Release
from kvdoctor.errors import InputError
from kvdoctor.model import Source
from kvdoctor.load.strict import Name, Tokens
from kvdoctor.load.yamlfile import error_detail, load_yaml

MAX_DEPLOY_BYTES = 1024 * 1024
# Engine knobs that used to sit under `budget:`: the old section -> the profile section, and renamed keys.
OLD_BUDGET_SECTIONS = ("vllm", "sglang", "mlx_lm")
RENAMED = {("sglang", "tp"): "tp_size"}


class Section(BaseModel):
    """Base of a profile's deploy section: unknown keys are refused. `release` is the engine release the
    check describes (kvdoctor.engines.releases.choose); None: the pinned one."""

    model_config = ConfigDict(extra="forbid")
    _release: Optional[str] = PrivateAttr(None)

    @property
    def release(self) -> Optional[str]:
        return self._release

    def at_release(self, version: Optional[str]) -> "Section":
        """A copy describing `version` of the engine."""
        copy = self.model_copy()
        copy._release = version
        return copy


class Deploy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Optional[Name] = None
    engine_version: Optional[str] = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*(\.post[0-9]+)?$")
    context_length: Optional[Tokens] = None
    budget: Optional[BudgetSettings] = None
    path: Optional[str] = Field(None, exclude=True)
    lines: dict[str, int] = Field(default_factory=dict, exclude=True)
    aliases: dict[str, str] = Field(default_factory=dict, exclude=True)  # setting -> its old spelling in the file
    warnings: list[str] = Field(default_factory=list, exclude=True)
    _sections: dict[str, BaseModel] = PrivateAttr(default_factory=dict)
    # engine -> the release its check describes, once chosen (kvdoctor.engines.releases.choose)
    _releases: dict[str, Release] = PrivateAttr(default_factory=dict)

    def settings(self, engine: str) -> BaseModel:
        """The engine profile's section: from the file, else every setting at its default; at the release
        chosen for that engine, if one was."""
        from kvdoctor.engines import profile_class, section_name

        section = self._sections.get(section_name(engine))
        section = section if section is not None else profile_class(engine).Settings()
        release = self._releases.get(engine)
        if release is not None and isinstance(section, Section):
            return section.at_release(release.version)
        return section

    def release(self, engine: str) -> Optional[Release]:
        return self._releases.get(engine)

    def with_release(self, engine: str, release: Release) -> "Deploy":
        """A copy whose `engine` section describes `release`."""
        copy = self.model_copy()
        copy._releases = {**self._releases, engine: release}
        return copy

    def source(self, dotted: str) -> Source:
        """Where a setting came from: its line in the deploy file, or the engine default."""
        if self.path and dotted in self.lines:
            return Source("deploy", self.aliases.get(dotted, dotted), self.path, self.lines[dotted])
        return Source("default", dotted)


def load_deploy(path: str | None) -> Deploy:
    if path is None:
        return Deploy()
    data, lines = load_yaml(Path(path), "deploy file", MAX_DEPLOY_BYTES)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: deploy file must be a YAML mapping")
    return deploy_from(data, path, lines)


def deploy_from(data: dict[str, Any], path: str | None = None, lines: dict[str, int] | None = None) -> Deploy:
    """Validate a deploy mapping (already parsed): the top level, then each profile's section."""
    from kvdoctor.engines import PROFILES, budget_engines, profile_class, section_name

    lines = dict(lines or {})
    aliases: dict[str, str] = {}
    warnings = _read_old_spelling(data, path, lines, aliases)
    sections = {section_name(name): name for name in PROFILES}
    for key, name in sections.items():
        warnings += _read_old_names(key, profile_class(name).Settings, data, path, lines, aliases)
    top = {k: v for k, v in data.items() if k not in sections}
    where_dir = str(Path(path).parent) if path else None
    try:
        deploy = Deploy.model_validate(top, context={"budget_engines": budget_engines()})
        found: dict[str, BaseModel] = {}
        for key, value in data.items():
            if key in sections:
                settings_model = profile_class(sections[key]).Settings
                try:
                    found[key] = settings_model.model_validate(value, context={"deploy_dir": where_dir})
                except ValidationError as exc:
                    raise _Located(key, exc) from None
    except (ValidationError, _Located) as exc:
        prefix, error = (exc.section, exc.error) if isinstance(exc, _Located) else ((), exc)
        err = error.errors()[0]
        field = ".".join(str(p) for p in (*prefix, *err["loc"]) if p != "[key]") or "(top level)"
        shown = aliases.get(field, field)
        where = f"{path}:{lines[field]}" if path and field in lines else str(path or "deploy settings")
        raise InputError(f"{where}: setting {shown!r}: {error_detail(err)}") from None
    deploy._sections = found
    deploy.path, deploy.lines, deploy.aliases, deploy.warnings = path, lines, aliases, warnings
    return deploy


class _Located(Exception):
    def __init__(self, section: str, error: ValidationError):
        super().__init__(section)
        self.section, self.error = (section,), error


def _read_old_names(section: str, model: type[BaseModel], data: dict[str, Any], path: str | None,
                    lines: dict[str, int], aliases: dict[str, str]) -> list[str]:
    """Rename a section's old setting names (the profile's `OLD_NAMES`, converted by its `old_value`),
    in place; the old line and spelling stay with the new name."""
    old_names: dict[str, str] = getattr(model, "OLD_NAMES", {})
    values = data.get(section)
    if not old_names or not isinstance(values, dict):
        return []
    moved = []
    for old, new in old_names.items():
        if old not in values:
            continue
        was, now = f"{section}.{old}", f"{section}.{new}"
        if new in values:
            raise InputError(f"{path}:{lines.get(was)}: setting {aliases.get(was, was)!r} is the old spelling of "
                             f"{now!r}, which the file also sets; keep one")
        values[new] = model.old_value(old, values.pop(old))  # type: ignore[attr-defined]
        aliases[now] = aliases.get(was, was)
        if was in lines:
            lines[now] = lines[was]
        moved.append(f"{aliases[now]} -> {now}")
    if not moved:
        return []
    return [f"{path}: old {section} setting names, read as: {', '.join(moved)} (see docs/vllm.md)"]


def _read_old_spelling(data: dict[str, Any], path: str | None, lines: dict[str, int],
                       aliases: dict[str, str]) -> list[str]:
    """Move `budget.<engine>.<knob>` into `<engine>.<knob>` (in place), remembering the old line and name."""
    budget = data.get("budget")
    if not isinstance(budget, dict):
        return []
    warnings = []
    for old in OLD_BUDGET_SECTIONS:
        values = budget.get(old)
        if not isinstance(values, dict):
            continue
        target = data.setdefault(old, {})
        if not isinstance(target, dict):
            continue
        del budget[old]
        moved = []
        for key, value in values.items():
            new = RENAMED.get((old, key), key)
            was, now = f"budget.{old}.{key}", f"{old}.{new}"
            if new in target:
                line = lines.get(was)
                raise InputError(f"{path}:{line}: setting {was!r} is the old spelling of {now!r}, which the file "
                                 "also sets; keep one")
            target[new] = value
            aliases[now] = was
            if was in lines:
                lines[now] = lines[was]
            moved.append(f"{was} -> {now}" if new != key else was)
        if f"budget.{old}" in lines:
            lines.setdefault(old, lines[f"budget.{old}"])
            aliases.setdefault(old, f"budget.{old}")
        where = f"{path}:{lines[f'budget.{old}']}" if path and f"budget.{old}" in lines else str(path)
        warnings.append(f"{where}: 'budget.{old}' is the old spelling; the {old} settings now belong in the "
                        f"top-level '{old}:' section, read by check and budget alike (read as such: "
                        f"{', '.join(moved) or 'empty'})")
    return warnings
