"""Progress on a terminal for work that can take more than a second: loading, each check, the dry
run's stages and steps.

Work reports with `update(...)`, which does nothing unless the CLI opened a display with `shown(True)`
(a terminal on stdout and stderr, a human format, no --quiet). The display is one transient line on
stderr, so nothing of it stays in the terminal or reaches a file or a pipe. Worker processes never
open one: many targets show the runner's bar instead.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

_sink: Callable[[str], None] | None = None


def update(description: str) -> None:
    """Say what is being done now (shown only when a display is open)."""
    if _sink is not None:
        _sink(description)


def wanted(quiet: bool, human_format: bool) -> bool:
    """Whether a run should show progress: a human format, both streams terminals, and no --quiet."""
    return not quiet and human_format and sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def shown(enabled: bool) -> Iterator[None]:
    """Open the display for the duration of the block when `enabled`."""
    global _sink
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=None)
        _sink = lambda description: bar.update(task, description=description, refresh=True)  # noqa: E731
        try:
            yield
        finally:
            _sink = None
