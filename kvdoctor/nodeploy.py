"""The deploy settings of a run without a deploy file, without building pydantic models up front.

A static check reads only whether a deploy file was given and the few top-level settings below,
which are the defaults of `deploy.Deploy` (a test holds them equal). Any other setting (an engine's
section) builds the real `Deploy()` on first use and answers from it, so every engine still sees
exactly the pydantic defaults.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.model import Source


class NoDeployFile:
    path = None
    engine = None
    context_length = None
    budget = None

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self._model: Any = None

    def source(self, dotted: str) -> Source:
        return Source("default", dotted)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_model":
            raise AttributeError(name)
        if self._model is None:
            from kvdoctor.deploy import Deploy

            self._model = Deploy()
        return getattr(self._model, name)
