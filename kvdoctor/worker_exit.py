"""What a forked -j worker closes when it ends: it leaves through os._exit, where atexit does not run.

A module of its own, below the engines and the fleet alike: the engines register (a worker's warm
dry-run children are closed so), the fleet's runner calls.
"""
from __future__ import annotations

from typing import Callable

_HOOKS: list[Callable[[], None]] = []


def at_worker_exit(close: Callable[[], None]) -> None:
    """Have this process call `close` when it ends as a forked -j worker."""
    _HOOKS.append(close)


def forget_parents_hooks() -> None:
    """In a freshly forked worker: the parent's hooks are not this worker's."""
    _HOOKS.clear()


def run_hooks() -> None:
    for close in _HOOKS:
        close()
