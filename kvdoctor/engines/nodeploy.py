"""The deploy settings of a run without a deploy file, without building pydantic models up front.

A static check reads only whether a deploy file was given, the few top-level settings below (the
defaults of `deploy.Deploy`; a test holds them equal) and the engine profile's section. That section
is handed out as a stand-in that builds the profile's real `Settings()` on first read, so an engine
that reads its settings sees exactly the pydantic defaults, and one that reads none (the `hf`
reference) never imports pydantic.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.model import Source


class DefaultSection:
    """A profile's deploy section at its defaults, built on first read; `isinstance` sees the real class."""

    def __init__(self, engine: str) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_model", None)

    def _built(self) -> Any:
        model = object.__getattribute__(self, "_model")
        if model is None:
            from kvdoctor.engines import profile_class

            model = profile_class(object.__getattribute__(self, "_engine")).Settings()
            object.__setattr__(self, "_model", model)
        return model

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._built())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy and pickle protocols: this object's own (see __reduce__)
            raise AttributeError(name)
        return getattr(self._built(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._built(), name, value)

    def __eq__(self, other: object) -> bool:
        return bool(self._built() == (other._built() if isinstance(other, DefaultSection) else other))

    def __hash__(self) -> int:
        return hash(self._built())

    def __repr__(self) -> str:
        return repr(self._built())

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (spawned workers, Ray) as what it stands for
        return (DefaultSection, (object.__getattribute__(self, "_engine"),))


class NoDeployFile:
    path = None
    engine = None
    engine_version = None
    context_length = None
    budget = None

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.aliases: dict[str, str] = {}
        self.warnings: list[str] = []
        self._sections: dict[str, DefaultSection] = {}
        self._releases: dict[str, Any] = {}  # engine -> kvdoctor.engines.releases.Release, once chosen

    def source(self, dotted: str) -> Source:
        return Source("default", dotted)

    def settings(self, engine: str) -> Any:
        """The engine profile's section, every setting at its default (as `Deploy().settings(engine)`), at
        the release chosen for that engine if one was."""
        if engine in self._releases:
            from kvdoctor.engines import profile_class

            from kvdoctor.engines.deploy import Section

            section = profile_class(engine).Settings()
            return section.at_release(self._releases[engine].version) if isinstance(section, Section) else section
        if engine not in self._sections:
            self._sections[engine] = DefaultSection(engine)
        return self._sections[engine]

    def release(self, engine: str) -> Any:
        return self._releases.get(engine)

    def with_release(self, engine: str, release: Any) -> "NoDeployFile":
        copy = NoDeployFile()
        copy._releases = {**self._releases, engine: release}
        return copy

    def __getattr__(self, name: str) -> Any:
        """Anything else a `Deploy` has: answered by a real `Deploy()`."""
        if name.startswith("_"):
            raise AttributeError(name)
        from kvdoctor.engines.deploy import Deploy

        return getattr(Deploy(), name)
