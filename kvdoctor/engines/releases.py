"""Engine releases as data: which releases each profile describes, which one a check is about and why, and
values that hold over a release range.

What differs between two releases of an engine (a decision, a default, a threshold, a message) is written once
in that engine's package as a list of `Ranged` values, each with the release range it holds for and its
public source; `at(values, release)` picks the one in force. No profile is copied per release.

The release a check describes: the one named (`--engine vllm==0.31.0`, or `engine_version` in the deploy
file), else the one installed in kvdoctor's own environment or in the `--engine-python` one, else the pinned
default (`PINS`: the release the whole test suite's goldens hold the profile to, and what a check without
kvdoctor's CLI describes). `Release.why` says which of these it was, and the reports print it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, Sequence, TypeVar

import msgspec

from kvdoctor.engines.pins import PINS, PROFILED
from kvdoctor.errors import InputError

T = TypeVar("T")


def key(version: str) -> tuple[int, ...]:
    """A release as a sortable tuple: 0.5.15.post1 -> (0, 5, 15, 1); only the release forms the engines use."""
    parts: list[int] = []
    for piece in version.replace(".post", ".").split("."):
        if not piece.isdigit():
            raise InputError(f"release {version!r}: expected numbers such as {PINS['vllm']}")
        parts.append(int(piece))
    return tuple(parts)


class Ranged(msgspec.Struct, Generic[T], frozen=True):
    """`value` from release `since` (inclusive, None: every profiled one before) up to `until` (exclusive,
    None: every later one); `source` is where the change is seen (a pull request, the code at both tags)."""

    value: T
    since: str | None = None
    until: str | None = None
    source: str = ""

    def holds(self, version: str) -> bool:
        v = key(version)
        return (self.since is None or key(self.since) <= v) and (self.until is None or v < key(self.until))


def at(values: Sequence[Ranged[T]], version: str) -> T:
    """The value in force at `version`: the first entry whose range holds it."""
    for value in values:
        if value.holds(version):
            return value.value
    raise LookupError(f"no value for release {version}")  # a table that does not cover a profiled release


class Release(msgspec.Struct, frozen=True):
    """The engine release one check describes, and why that one."""

    dist: str
    version: str
    why: str

    def text(self) -> str:
        return f"{self.dist} {self.version} ({self.why})"


def default(dist: str) -> str:
    return PINS[dist]


def split_engine(value: str, where: str = "--engine") -> tuple[str, str | None]:
    """`vllm==0.31.0` -> ("vllm", "0.31.0"); `vllm` -> ("vllm", None)."""
    name, sep, version = value.partition("==")
    name, version = name.strip(), version.strip()
    if sep and not version:
        raise InputError(f"{where} {value!r}: expected ENGINE or ENGINE==RELEASE, e.g. vllm=={PROFILED['vllm'][-1]}")
    return name, (version or None)


def parse_engine(value: str, command: str = "check", where: str = "--engine") -> tuple[str, str | None]:
    """The one reading of an engine option, whichever command or file gives it (`--engine` of check, config,
    diff, budget and fit, `diff --to`, the API's `engine`, a deploy or config file's `engine`): ENGINE or
    ENGINE==RELEASE, ENGINE one that `command` takes. The release is checked against the profiled ones when it
    is chosen (`for_engine`)."""
    from kvdoctor.engines import budget_engines, check_engines, fit_engines, is_check_engine

    name, version = split_engine(value, where)
    if command == "check" and is_check_engine(name):  # imports that profile alone
        return name, version
    choices = {"check": lambda: sorted(check_engines()), "budget": lambda: [*budget_engines(), "all"],
               "fit": fit_engines}[command]()
    if name not in choices:
        raise InputError(f"{where}: unknown engine {name!r}; expected one of: {', '.join(choices)}")
    if name == "all" and version is not None:
        raise InputError(f"{where} {value!r}: a release belongs to one engine, e.g. vllm=={version}")
    return name, version


def check_profiled(dist: str, version: str, where: str) -> str:
    """`version` if kvdoctor profiles that release of `dist`; InputError naming the ones it does otherwise."""
    known = PROFILED.get(dist, ())
    if version not in known:
        shown = ", ".join(known) if known else "none"
        raise InputError(f"{where}: {dist} {version} is not a profiled release; kvdoctor describes: {shown}")
    return version


def choose(dist: str, asked: str | None, asked_where: str, engine_python: str | None = None) -> Release:
    """The release of `dist` a check describes (see the module's docstring for the order)."""
    if asked is not None:
        return Release(dist, check_profiled(dist, asked, asked_where), f"named by {asked_where}")
    if engine_python is not None:
        from kvdoctor.engines.venvs import installed_versions

        have = installed_versions(Path(engine_python), [dist]).get(dist)
        if have is not None:
            return _installed(dist, have, f"installed in --engine-python {engine_python}")
    have = _installed_here(dist)
    if have is not None:
        return _installed(dist, have, "installed in kvdoctor's environment")
    return Release(dist, default(dist), "kvdoctor's default release; none is installed here")


def for_engine(deploy: Any, engine: str, asked: str | None, where: str, engine_python: str | None = None) -> Any:
    """The deploy settings (a `Deploy` or the no-file stand-in) with the release the check of `engine` describes
    chosen: `asked` (from `where`), else the deploy file's `engine_version` when the file is about this engine,
    else the installed or the default one."""
    from kvdoctor.engines import profile_class

    if asked is None and getattr(deploy, "engine_version", None) is not None and deploy.engine in (None, engine):
        asked, where = deploy.engine_version, f"engine_version in deploy file {deploy.path}"
    dist = profile_class(engine).release_dist
    if dist is None:
        if asked is not None:
            pinned = ", ".join(f"{k} {v}" for k, v in profile_class(engine).pins.items()) or "none"
            raise InputError(f"{where}: {engine} describes one release only ({pinned}); name it without ==")
        return deploy
    return deploy.with_release(engine, choose(dist, asked, where, engine_python))


def _installed_here(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed(dist: str, have: str, where: str) -> Release:
    if have in PROFILED.get(dist, ()):
        return Release(dist, have, where)
    return Release(dist, default(dist), f"{dist} {have} {where} is not a profiled release: kvdoctor's default one")
