"""`kvdoctor explain CODE`: one catalog entry as a page."""
from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from kvdoctor.catalog import Entry


def render_entry(entry: Entry, console: Console | None = None) -> None:
    parts: list = [Text(entry.summary, style="bold"), Text("")]
    engines = ", ".join(f"{r.name} {r.versions}" for r in entry.engines)
    parts.append(Text(f"severity: {entry.severity}   engines: {engines}   check: {entry.check}", style="dim"))
    if entry.error:
        parts += [Text(""), Text("Engine error", style="bold underline"),
                  Text(f"{entry.error.class_}: {entry.error.message}", style="red"),
                  Text(f"raised at {entry.error.source}", style="dim")]
    parts += [Text(""), Text("What it means", style="bold underline"), Text(entry.meaning.strip())]
    parts += [Text(""), Text("When it happens", style="bold underline")]
    parts += [Text(f"  - {t}") for t in entry.triggers]
    parts += [Text(""), Text("Fixes", style="bold underline")]
    for i, fix in enumerate(entry.fixes, 1):
        parts.append(Text(f"  {i}. {fix.summary}", style="green"))
        if fix.before:
            parts += [Text("     before:", style="dim"), Syntax(fix.before.rstrip(), "yaml", theme="ansi_dark")]
        if fix.after:
            parts += [Text("     after:", style="dim"), Syntax(fix.after.rstrip(), "yaml", theme="ansi_dark")]
    if entry.prevention:
        parts += [Text(""), Text("Prevention", style="bold underline")]
        parts += [Text(f"  - {p}") for p in entry.prevention]
    if entry.references:
        parts += [Text(""), Text("References", style="bold underline")]
        parts += [Text(f"  - {r}") for r in entry.references]
    (console or Console()).print(Panel(Group(*parts), title=f"{entry.code} {entry.name}", border_style="cyan"))
