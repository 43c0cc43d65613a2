"""Project settings: `[tool.kvdoctor]` in pyproject.toml or a kvdoctor.toml, merged with the command line.

The nearest file wins (in one directory kvdoctor.toml before pyproject.toml; a pyproject.toml without
`[tool.kvdoctor]` is passed over), the command line beats the file, and every value remembers where it
came from so `kvdoctor config` can show it. A path in the file is relative to the file's directory,
which is also the project root that report locations and model identities are relative to.
"""
from __future__ import annotations

import fnmatch
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import msgspec

from kvdoctor.errors import InputError
from kvdoctor.load.jsonfile import read_bounded
from kvdoctor.checks.selection import Selection, validate_selectors

if TYPE_CHECKING:
    from kvdoctor.engines.deploy import Deploy

CONFIG_NAMES = ("kvdoctor.toml", "pyproject.toml")
MAX_CONFIG_BYTES = 1024 * 1024
DEFAULT_ENGINE = "hf"
DEFAULT_FAIL_ON = "error"
COMMAND_LINE = "command line"
DEFAULT = "default"


# What FileSettings() holds: the settings of a project without a config file (tested against it).
NO_FILE = SimpleNamespace(select=None, extend_select=[], ignore=[], per_model_ignores={}, severity={}, engine=None,
                          deploy=None, fail_on=None, targets=None)


class ConfigFile(msgspec.Struct):
    path: Path
    settings: Any  # settings_file.FileSettings
    lines: dict[str, int]  # key (kebab-case, subtable keys as 'severity.CFG004') -> line in the file

    @property
    def root(self) -> Path:
        return self.path.parent

    def origin(self, key: str) -> str:
        line = self.lines.get(key) or self.lines.get(key.partition(".")[0])
        return f"{self.path}:{line}" if line else str(self.path)


class CommandLine(msgspec.Struct):
    """What was given on the command line; None (or empty) means 'not given'."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    severity: dict[str, str] = msgspec.field(default_factory=dict)
    engine: str | None = None  # ENGINE or ENGINE==RELEASE
    deploy: str | None = None
    fail_on: str | None = None
    config: str | None = None
    isolated: bool = False
    engine_python: str | None = None  # --engine-python: where the installed release is looked for


class Settings(msgspec.Struct):
    selection: Selection
    per_model_ignores: dict[str, tuple[str, ...]]
    severity: dict[str, str]
    engine: str
    deploy: Deploy
    fail_on: str
    root: Path
    config: Path | None
    origins: dict[str, str]  # setting -> "command line", "default", a file with its line, ...
    targets: tuple[str, ...] = ()  # the config file's targets, relative to the working directory

    def selection_for(self, identity: str) -> Selection:
        """The selection for one model: the per-model ignores whose glob matches its identity added."""
        extra = [code for glob, codes in self.per_model_ignores.items()
                 if fnmatch.fnmatchcase(identity, glob) for code in codes]
        if not extra:
            return self.selection
        return Selection(self.selection.select, self.selection.extend_select, self.selection.ignore + tuple(extra))

    def _release_row(self) -> list[tuple[str, object, str]]:
        release = self.deploy.release(self.engine)
        return [] if release is None else [("engine release", f"{release.dist} {release.version}", release.why)]

    def shown(self) -> list[tuple[str, object, str]]:
        """(setting, value, where it came from), for `kvdoctor config`."""
        sel = self.selection
        return [
            ("config file", str(self.config) if self.config else None, self.origins["config file"]),
            ("project root", str(self.root), self.origins["project root"]),
            ("select", list(sel.select), self.origins["select"]),
            ("extend-select", list(sel.extend_select), self.origins["extend-select"]),
            ("ignore", list(sel.ignore), self.origins["ignore"]),
            ("per-model-ignores", {g: list(c) for g, c in self.per_model_ignores.items()},
             self.origins["per-model-ignores"]),
            ("severity", dict(self.severity), self.origins["severity"]),
            ("engine", self.engine, self.origins["engine"]),
            *self._release_row(),
            ("deploy", self.deploy.path, self.origins["deploy"]),
            ("fail-on", self.fail_on, self.origins["fail-on"]),
            ("targets", list(self.targets), self.origins.get("targets", DEFAULT)),
        ]


def find_config(start: Path) -> Path | None:
    """The nearest kvdoctor.toml, or pyproject.toml with a [tool.kvdoctor] table, from `start` upward."""
    for folder in (start, *start.parents):
        for name in CONFIG_NAMES:
            candidate = folder / name
            if candidate.is_file() and (name != "pyproject.toml" or _has_kvdoctor_table(candidate)):
                return candidate
    return None


def _has_kvdoctor_table(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*\[\s*tool\s*\.\s*kvdoctor\s*[\].]", text, re.MULTILINE) is not None


def read_config(path: Path) -> ConfigFile:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib

    text = read_bounded(path, MAX_CONFIG_BYTES, "config file").decode("utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    table_path: tuple[str, ...] = ()
    if path.name == "pyproject.toml":
        table_path = ("tool", "kvdoctor")
        data = data.get("tool", {}).get("kvdoctor", {})
    if not isinstance(data, dict):
        raise InputError(f"{path}: [tool.kvdoctor] must be a table")
    lines = _key_lines(text, table_path)
    from pydantic import ValidationError

    from kvdoctor.cli.settings_file import FileSettings

    try:
        settings = FileSettings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        line = lines.get(key) or lines.get(key.partition(".")[0])
        where = f"{path}:{line}" if line else str(path)
        raise InputError(f"{where}: setting {key!r}: {err['msg'].removeprefix('Value error, ')}") from None
    return ConfigFile(path, settings, lines)


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)\s*=""")


def _key_lines(text: str, table: tuple[str, ...]) -> dict[str, int]:
    """Line of each key in our table (and one level of subtables): enough to point at a setting."""
    lines: dict[str, int] = {}
    current: tuple[str, ...] | None = table if not table else None
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            parts = tuple(p.strip().strip("\"'") for p in header.group(1).split("."))
            if parts[:len(table)] == table and len(parts) <= len(table) + 1:
                current = parts[len(table):]
                if current:
                    lines.setdefault(current[0], number)
            else:
                current = None
            continue
        key = _KEY.match(line)
        if key and current is not None:
            name = key.group(1).strip("\"'")
            lines.setdefault(".".join((*current, name)), number)
    return lines


def project_root(start: Path) -> Path:
    """Without a config file: the nearest folder holding .git, else the working directory."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


def _check_selectors(selectors: list[str] | tuple[str, ...], known: list[str], where: str) -> tuple[str, ...]:
    upper = tuple(s.strip().upper() for s in selectors if s.strip())
    unknown = validate_selectors(upper, known)
    if unknown:
        raise InputError(f"{where}: unknown rule selector(s): {', '.join(unknown)} (see `kvdoctor rules`)")
    return upper


def _check_codes(codes: list[str] | tuple[str, ...], known: list[str], where: str) -> None:
    unknown = [c for c in codes if c not in known]
    if unknown:
        raise InputError(f"{where}: unknown rule code(s): {', '.join(unknown)} (see `kvdoctor rules`)")


def _load_deploy(path: str | None):
    """The deploy file's settings; without a file, the engine defaults, whose pydantic model is built
    only when an engine reads one of its sections (nodeploy.py)."""
    if path is None:
        from kvdoctor.engines.nodeploy import NoDeployFile

        return NoDeployFile()
    from kvdoctor.engines.deploy import load_deploy

    return load_deploy(path)


def resolve(cli: CommandLine, known_codes: list[str]) -> Settings:
    """Merge defaults, the nearest config file (searched from the working directory) and the command
    line, validating every value."""
    from kvdoctor.engines.releases import for_engine, parse_engine

    cwd = Path.cwd()
    config_path = None if cli.isolated else (Path(os.path.abspath(cli.config)) if cli.config else find_config(cwd))
    if config_path is not None and not config_path.is_file():
        raise InputError(f"{cli.config}: config file not found")
    config = read_config(config_path) if config_path else None
    file = config.settings if config else NO_FILE
    origins: dict[str, str] = {
        "config file": COMMAND_LINE if cli.config else ("--isolated" if cli.isolated else "searched from the working directory"),
        "project root": "the config file's directory" if config else "nearest .git, else the working directory",
    }

    def from_file(key: str) -> str:
        assert config is not None
        return config.origin(key)

    # Selection: a --select on the command line starts afresh (ruff); otherwise the command line adds to the file.
    if cli.select is not None:
        select = _check_selectors(cli.select, known_codes, "--select")
        extend = _check_selectors(cli.extend_select, known_codes, "--extend-select")
        ignore = _check_selectors(cli.ignore, known_codes, "--ignore")
        origins.update({"select": COMMAND_LINE, "extend-select": COMMAND_LINE, "ignore": COMMAND_LINE})
    else:
        select = _check_selectors(file.select, known_codes, from_file("select")) if file.select is not None else ("ALL",)
        origins["select"] = from_file("select") if file.select is not None else DEFAULT
        file_extend = _check_selectors(file.extend_select, known_codes, from_file("extend-select")) if config else ()
        file_ignore = _check_selectors(file.ignore, known_codes, from_file("ignore")) if config else ()
        cli_extend = _check_selectors(cli.extend_select, known_codes, "--extend-select")
        cli_ignore = _check_selectors(cli.ignore, known_codes, "--ignore")
        # A code the command line extend-selects outright is no longer ignored by the file.
        extend = file_extend + cli_extend
        ignore = tuple(s for s in file_ignore if s not in cli_extend) + cli_ignore
        for key, from_cfg, from_cli in (("extend-select", file_extend, cli_extend), ("ignore", file_ignore, cli_ignore)):
            where = [from_file(key)] if from_cfg else []
            where += [COMMAND_LINE] if from_cli else []
            origins[key] = " + ".join(where) or DEFAULT
    selection = Selection(select=select, extend_select=extend, ignore=ignore)

    per_model: dict[str, tuple[str, ...]] = {}
    for glob, codes in file.per_model_ignores.items():
        per_model[glob] = _check_selectors(codes, known_codes, from_file(f"per-model-ignores.{glob}"))
    origins["per-model-ignores"] = from_file("per-model-ignores") if per_model else DEFAULT

    severity: dict[str, str] = {code.upper(): level for code, level in file.severity.items()}
    if config:
        _check_codes(list(severity), known_codes, from_file("severity"))
    _check_codes(list(cli.severity), known_codes, "--severity")
    for code, level in cli.severity.items():
        if level not in ("error", "warning", "info"):
            raise InputError(f"--severity {code}={level}: expected error, warning or info")
    severity.update(cli.severity)
    origins["severity"] = " + ".join(
        ([from_file("severity")] if file.severity else []) + ([COMMAND_LINE] if cli.severity else [])) or DEFAULT

    if cli.deploy is not None:
        deploy_path, origins["deploy"] = cli.deploy, COMMAND_LINE
    elif file.deploy is not None:
        deploy_path = os.path.relpath(config.root / str(file.deploy), cwd)  # type: ignore[union-attr]
        origins["deploy"] = from_file("deploy")
    else:
        deploy_path, origins["deploy"] = None, DEFAULT
    deploy = _load_deploy(deploy_path)

    # Engine: the command line, then the deploy file (it describes one engine's start-up), then the config file.
    if cli.engine is not None:
        engine, origins["engine"] = cli.engine, COMMAND_LINE
    elif deploy.engine:
        engine, origins["engine"] = deploy.engine, f"deploy file {deploy_path}"
    elif file.engine:
        engine, origins["engine"] = file.engine, from_file("engine")
    else:
        engine, origins["engine"] = DEFAULT_ENGINE, DEFAULT
    engine_where = origins["engine"] if origins["engine"] != COMMAND_LINE else "--engine"
    engine, asked = parse_engine(engine, "check", engine_where)
    deploy = for_engine(deploy, engine, asked, engine_where, cli.engine_python)

    if cli.fail_on is not None:
        if cli.fail_on not in ("error", "warning", "info"):
            raise InputError(f"--fail-on {cli.fail_on!r}: expected error, warning or info")
        fail_on, origins["fail-on"] = cli.fail_on, COMMAND_LINE
    elif file.fail_on is not None:
        fail_on, origins["fail-on"] = file.fail_on, from_file("fail-on")
    else:
        fail_on, origins["fail-on"] = DEFAULT_FAIL_ON, DEFAULT

    targets = tuple(os.path.relpath(config.root / t, cwd) for t in file.targets or ()) if config else ()
    origins["targets"] = from_file("targets") if targets else DEFAULT

    root = config.root if config else project_root(cwd)
    return Settings(selection=selection, per_model_ignores=per_model, severity=severity, engine=engine,
                    deploy=deploy, fail_on=fail_on, root=root, config=config_path, origins=origins, targets=targets)
