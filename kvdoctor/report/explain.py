"""`kvdoctor explain CODE`, `kvdoctor rules` and `kvdoctor triage`: catalog entries for a person to read.

Entries keep their prose as YAML blocks with hard line breaks; here it is reflowed into paragraphs
(a blank line separates them, a line starting with "- " or indented stays a line of its own), and each
sentence starts a line, so a wide terminal never breaks one and a narrow one breaks only the long ones.
Before/after examples are lines a user copies: each is printed whole, never wrapped or cut by kvdoctor
(a narrow terminal shows it folded, and copies it as one line).
"""
from __future__ import annotations

import re
import textwrap

from rich.console import Console, RenderableType
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from kvdoctor.catalog import Catalog, Entry
from kvdoctor.checks import checking_module, preventers


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[])")
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def sentences(paragraph: str) -> list[str]:
    """A paragraph cut where a sentence ends (a stop, then a capital, a quote or a bracket)."""
    out: list[str] = []
    for piece in SENTENCE_END.split(paragraph):
        if out and out[-1].endswith(ABBREVIATIONS):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def _prose(text: str, style: str = "") -> Text:
    """One sentence a line; rich wraps only a sentence longer than the terminal."""
    return Text("\n".join(sentences(" ".join(text.split()))), style=style)


def reflow(text: str) -> list[str]:
    """Paragraphs of `text` with the hard line breaks inside each one removed."""
    paragraphs, current = [], []
    for line in text.strip().splitlines():
        if not line.strip():
            if current:
                paragraphs.append(" ".join(current))
                current = []
        elif line.startswith((" ", "\t", "- ", "* ")) and current:
            paragraphs.append(" ".join(current))
            current = [line.strip()]
        else:
            current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def engines_text(entry: Entry) -> str:
    return ", ".join(f"{r.name} {r.versions}" for r in entry.engines)


def prevention_text(entry: Entry) -> str:
    codes = preventers(entry)
    if codes:
        return "kvdoctor check catches this before deploy: " + ", ".join(codes)
    return "no kvdoctor check catches this before deploy yet"


def _item(marker: str, text: str, style: str = "") -> Table:
    """A list item whose wrapped lines hang under its text, not under its marker."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=len(marker) + 2, justify="right", no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    grid.add_row(Text(marker, style=style), _prose(text, style))
    return grid


class Whole:
    """Lines a user copies (examples, paths, links), each printed whole at an indent: never wrapped or
    cropped by kvdoctor, so a narrow terminal folds them and a copy gives the line as written."""

    def __init__(self, lines: list[Text], indent: int = 7) -> None:
        self.lines = lines
        self.indent = indent


def _example(label: str, code: str) -> list:
    return [Text(" " * 5 + label, style="dim"),
            Whole(Syntax("", "yaml", theme="ansi_dark").highlight(code.rstrip()).split("\n"))]


def render_entry(entry: Entry, console: Console | None = None) -> None:
    console = console or Console()
    parts: list[RenderableType | Whole] = [Text(entry.summary, style="bold"), Text("")]
    parts.append(Text(f"severity: {entry.severity}   engines: {engines_text(entry)}   "
                      f"check: {checking_module(entry.code)}", style="dim"))
    parts.append(Text(prevention_text(entry), style="dim"))
    if entry.error:
        parts += [Text(""), Text("Engine error", style="bold underline"),
                  Text(f"{entry.error.class_}: {entry.error.message}", style="red"),
                  Whole([Text(f"raised at {entry.error.source}", style="dim")], indent=0)]
    parts += [Text(""), Text("What it means", style="bold underline")]
    for i, paragraph in enumerate(reflow(entry.meaning)):
        parts += ([Text("")] if i else []) + [_prose(paragraph)]
    parts += [Text(""), Text("When it happens", style="bold underline")]
    parts += [_item("-", t) for t in entry.triggers]
    parts += [Text(""), Text("Fixes", style="bold underline")]
    for i, fix in enumerate(entry.fixes, 1):
        parts.append(_item(f"{i}.", fix.summary, "green"))
        if fix.before:
            parts += _example("before:", fix.before)
        if fix.after:
            parts += _example("after:", fix.after)
    if entry.prevention:
        parts += [Text(""), Text("Prevention", style="bold underline")]
        parts += [_item("-", p) for p in entry.prevention]
    if entry.references:
        parts += [Text(""), Text("References", style="bold underline")]
        parts.append(Whole([Text(f"- {r}") for r in entry.references], indent=2))
    console.rule(Text(f"{entry.code} {entry.name}", style="bold"), style="cyan", align="left")
    for part in parts:
        if isinstance(part, Whole):
            for line in part.lines:
                console.print(Text(" " * part.indent) + line, soft_wrap=True)
        else:
            console.print(part)
    console.rule(style="cyan")


def rules_text(catalog: Catalog, verbose: bool = False, width: int = 80) -> str:
    """The catalog as plain lines that read at `width` columns: code, severity and name, then the
    summary on its own indented line; --verbose adds engines, check and preventing codes."""
    out = [f"kvdoctor catalog: {len(catalog.codes())} entries"]
    indent = " " * 9
    for code in catalog.codes():
        e = catalog[code]
        out.append(f"{code:<8} {e.severity:<7} {e.name}")
        out += textwrap.wrap(e.summary, width=width, initial_indent=indent, subsequent_indent=indent)
        if verbose:
            extra = f"engines: {engines_text(e)}; check: {checking_module(e.code)}"
            if e.prevented_by:
                extra += f"; prevented by: {', '.join(e.prevented_by)}"
            out += textwrap.wrap(extra, width=width, initial_indent=indent, subsequent_indent=indent)
    return "\n".join(out)


def rules_markdown(catalog: Catalog) -> str:
    rows = ["| code | severity | name | engines | summary |", "|---|---|---|---|---|"]
    for code in catalog.codes():
        e = catalog[code]
        cells = [code, e.severity, e.name, engines_text(e), e.summary]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def rules_json(catalog: Catalog) -> list[dict]:
    out = []
    for e in catalog.entries.values():
        fields = e.model_dump(by_alias=True)
        del fields["prevented_by"]
        out.append({**fields, "check": checking_module(e.code), "prevented_by": preventers(e)})
    return out


def render_triage(report, source: str, console: Console | None = None) -> None:
    console = console or Console()
    for hit in report.hits:
        where = ", ".join(map(str, hit.lines[:10])) + (" ..." if len(hit.lines) > 10 else "")
        console.print(Text(f"{hit.entry.code} found at line {where}: ", style="bold red") + Text(hit.text))
        console.print(Text(f"  {engines_text(hit.entry)}; {prevention_text(hit.entry)}", style="dim"))
        render_entry(hit.entry, console)
    for item in report.unattributed:
        hint = item["hint"]
        nearest = f"; nearest hint at line {hint['line']}: {hint['text']}" if hint else "; no engine frame or kernel nearby"
        console.print(Text(f"unattributed GPU error at line {item['line']}: ", style="bold yellow")
                      + Text(item["text"] + nearest))
    if report.unknown is not None:
        console.print(Text(f"unknown: no catalog entry matches; looked at line {report.unknown['line']}: ",
                           style="bold yellow") + Text(report.unknown["text"]))
    elif not report.hits and not report.unattributed:
        console.print(Text("unknown: the log is empty", style="bold yellow"))
    console.print(f"{len(report.hits)} known error(s) in {source} ({report.lines_read} line(s) read)", markup=False)
