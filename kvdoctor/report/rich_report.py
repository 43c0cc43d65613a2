"""The terminal report: a model summary, the layer layout as coloured cells, and each finding with its fixes.

With more than one target, each note (an info finding) keeps only its head line in its panel and is
written once after the panels, with the targets it applies to; then a table, one row per model, and
the closing line.
"""
from __future__ import annotations

from rich.box import SIMPLE_HEAD
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvdoctor.engines import is_reference
from kvdoctor.limits import human_bytes
from kvdoctor.model import Finding, Result
from kvdoctor.report import closing_line, fleet_rows, for_whom, shared_notes, span
from kvdoctor.report.versions import engine_line

KIND_STYLE = {
    "full_attention": ("F", "black on green"),
    "sliding_attention": ("S", "black on cyan"),
    "chunked_attention": ("C", "black on bright_cyan"),
    "mla": ("L", "white on blue"),
    "kda": ("K", "white on magenta"),
    "gated_deltanet": ("G", "white on dark_magenta"),
    "mamba": ("M", "black on yellow"),
    "linear_attention": ("N", "white on purple"),
    "attention+mamba": ("H", "black on bright_yellow"),
    "sparse_mla": ("D", "white on dark_blue"),
    "compressed_attention": ("Z", "white on navy_blue"),
    "conv": ("V", "black on khaki1"),
    "none": ("-", "black on grey50"),
    "unknown": ("?", "white on red"),
}
# What each engine builds for a layer (LayerPlan.cache). A letter means one thing in both rows where it
# can (F full, L MLA, K KDA, M recurrent state); "?" only where the engine's plan does not know.
CACHE_STYLE = {
    "full": ("F", "black on green"), "contiguous": ("F", "black on green"),
    "windowed": ("W", "black on cyan"), "swa": ("W", "black on cyan"), "rotating": ("R", "black on cyan"),
    "chunked": ("C", "black on bright_cyan"), "mla": ("L", "white on blue"),
    "kda-replayssm": ("K", "white on magenta"), "state": ("M", "black on yellow"), "mamba": ("M", "black on yellow"),
    "native": ("A", "black on khaki1"), "none": ("-", "black on grey50"), "unknown": ("?", "white on red"),
}
SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}


def _cells(values: list[tuple[str, str]], width: int = 48) -> Text:
    text = Text()
    for i, (char, style) in enumerate(values):
        if i and i % width == 0:
            text.append("\n")
        text.append(char, style=style)
    return text


def layout(result: Result) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", justify="right")
    grid.add_column()
    kinds = [KIND_STYLE.get(row["kind"], KIND_STYLE["unknown"]) for row in result.layers]
    grid.add_row("model", _cells(kinds))
    serving = not is_reference(result.engine)
    if serving:
        caches = [CACHE_STYLE.get(row.get("cache") or "none", ("?", "white on red")) for row in result.layers]
        grid.add_row(result.engine, _cells(caches))
    windows = sorted({row["window"] for row in result.layers if row["window"] is not None})
    engine_windows = sorted({row["engine_window"] for row in result.layers if row["engine_window"] is not None})
    legend = Text("model: ", style="dim")
    present = dict.fromkeys(row["kind"] for row in result.layers)
    for kind in present:
        char, style = KIND_STYLE.get(kind, KIND_STYLE["unknown"])
        count = sum(1 for row in result.layers if row["kind"] == kind)
        legend.append(char, style=style).append(f" {kind} x{count}  ")
    if windows:
        legend.append(f"window {', '.join(map(str, windows))}  ", style="cyan")
    grid.add_row("", legend)
    if serving:
        legend = Text(f"{result.engine}: ", style="dim")
        for cache in dict.fromkeys(row.get("cache") or "none" for row in result.layers):
            char, style = CACHE_STYLE.get(cache, ("?", "white on red"))
            count = sum(1 for row in result.layers if (row.get("cache") or "none") == cache)
            legend.append(char, style=style).append(f" {cache} x{count}  ")
        legend.append(f"window {', '.join(map(str, engine_windows)) or 'none'}", style="cyan")
        grid.add_row("", legend)
    return grid


def model_summary(result: Result) -> Table:
    info = result.info
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    table.add_row("model_type", f"{result.model_type}  (family: {info.get('family')})")
    table.add_row("layers", str(info.get("num_hidden_layers")))
    if info.get("dtype"):
        table.add_row("dtype", str(info["dtype"]))
    ckpt = info.get("checkpoint")
    table.add_row("checkpoint", "none (config checks only)" if not ckpt else
                  f"{ckpt['tensors']} tensors in {ckpt['files']} file(s), {ckpt['bytes'] / 2**30:.2f} GiB (headers read)")
    if result.source and result.source.get("kind") != "directory":  # a directory: the panel's title says it
        table.add_row("source", source_line(result.source))
    table.add_row("engine", engine_line(result.engine, result.engine_versions, result.info.get("release")))
    # Text: a note may hold brackets ("[mlx]", a layer list) that rich would read as markup
    for key, value in (info.get("defaults") or {}).items():
        table.add_row("default", Text(f"{key} = {value!r} (absent from config.json; the family default)"))
    for note in info.get("notes") or []:
        table.add_row("note", Text(note))
    for note in info.get("engine_notes") or []:
        table.add_row("engine note", Text(note))
    return table


def source_line(source: dict) -> str:
    """Where the files of a Hugging Face id were read: the local cache, or a Hub (with what it cost)."""
    if source.get("kind") == "hf-cache":
        return f"local Hugging Face cache, commit {source.get('commit')}"
    where = f"Hub, {source.get('revision')} at commit {str(source.get('commit'))[:12]}"
    if source.get("cached"):
        return f"{where} (metadata fetched before: nothing fetched now)"
    return f"{where}: {human_bytes(source.get('bytes_fetched') or 0)} fetched in {source.get('seconds')} s"


def _shape(value) -> str:
    """[32, 128, 128] -> 32x128x128 (narrow enough for a column per TP size)."""
    return "x".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def state_caches(result: Result) -> Group | None:
    """Per-slot state cache shapes and bytes for each tensor-parallel size, for layers that keep
    state (KDA ReplaySSM): a table per group of layers with the same shapes, a row per tensor and a
    column per TP size, which fits 80 columns."""
    groups: dict[str, tuple[dict, list[int]]] = {}
    for row in result.layers:
        state = row.get("state")
        if state:
            key = repr(sorted(state.items()))
            groups.setdefault(key, (state, []))[1].append(row["index"])
    if not groups:
        return None
    tables = []
    for state, indices in groups.values():
        sizes = sorted(state, key=int)
        table = Table(title=f"state caches per slot, layers {span(indices)} (slot dimension left out)",
                      title_justify="left", box=None, padding=(0, 1))
        table.add_column("tensor", style="bold")
        for tp in sizes:
            table.add_column(f"TP {tp}", justify="right")
        names = list(dict.fromkeys(name for tp in sizes for name in state[tp] if name != "bytes_per_slot"))
        for name in names:
            table.add_row(name, *[_shape(state[tp].get(name, "-")) for tp in sizes])
        table.add_row("bytes/slot", *[f"{state[tp].get('bytes_per_slot', 0):,}" for tp in sizes])
        tables.append(table)
    return Group(*tables)


def _hanging(prefix: Text | str, body: Text | str, style: str = "") -> Table:
    """`prefix` then `body`, whose wrapped lines stay under the body, never back at column 0."""
    prefix = prefix if isinstance(prefix, Text) else Text(prefix, style=style)
    grid = Table.grid()
    grid.add_column(width=prefix.cell_len, no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(prefix, body if isinstance(body, Text) else Text(body, style=style))
    return grid


def head_line(f: Finding, aside: str = "") -> Table:
    """A finding's head line: code, severity, name, place (and `aside`, dim)."""
    assert f.severity is not None  # the catalog's, once finalized
    head = Text()
    head.append(f"{f.severity} ", style=SEVERITY_STYLE[f.severity])
    head.append(f"[{f.name}] ", style="dim")
    if f.file:
        head.append(f"{f.file}{':' + str(f.line) if f.line else ''} ", style="underline")
    if f.layer is not None:
        head.append(f"layer {f.layer} ", style="bold")
    if aside:
        head.append(aside, style="dim")
    head.rstrip()
    return _hanging(Text(f"{f.code} ", style=SEVERITY_STYLE[f.severity]), head)


def finding_body(f: Finding) -> list[RenderableType]:
    """Message, engine error and fixes, each indented under its text when it wraps."""
    parts: list[RenderableType] = [_hanging("  ", f.message)]
    if f.engine_error:
        err = f.engine_error
        said = "the message above" if err.get("message") == f.message else err.get("message")
        parts.append(_hanging("  ", f"engine would raise at {err.get('stage')}: {err.get('class')}: {said}",
                              style="red"))
    for fix in f.fixes:
        parts.append(_hanging("  fix: ", fix, style="green"))
    return parts


def finding_block(f: Finding) -> Group:
    return Group(head_line(f), *finding_body(f))


def _gathered(f: Finding, fleet: bool) -> bool:
    """Whether the finding's text is left to the notes after the panels (a note, in a fleet run)."""
    return fleet and f.severity == "info"


def result_panel(result: Result, fleet: bool = False) -> Panel:
    """One checked target's panel: its summary, layout, state caches and findings. In a fleet run
    (`fleet`) a note shows its head line only; `notes` writes its text once."""
    body: list[RenderableType] = [model_summary(result), Text(""), layout(result), Text("")]
    states = state_caches(result)
    if states is not None:
        body += [states, Text("")]
    for f in result.findings:
        body.append(head_line(f, "(in the notes below the panels)") if _gathered(f, fleet) else finding_block(f))
    if not result.findings:
        body.append(Text("no findings", style="green"))
    return Panel(Group(*body), title=result.target, border_style="cyan")


def panel_text(console: Console, result: Result, fleet: bool = False) -> str:
    """The result's panel exactly as `console` would print it. A -j worker forked from the process that
    owns the console renders its own results so; the parent then writes the texts in input order."""
    if result.error:
        return ""  # the one line on stderr says why it could not be checked
    with console.capture() as capture:
        console.print(result_panel(result, fleet))
    return capture.get()


def notes(results: list[Result]) -> Group | None:
    """Each distinct note of a fleet once, headed by the targets (and layers) it was given for."""
    groups = shared_notes(results)
    if not groups:
        return None
    checked = {r.target for r in results if not r.error}
    parts: list[RenderableType] = [Text("Notes", style="bold underline")]
    for f, targets in groups:
        note = Finding(f.code, f.message, engine_error=f.engine_error, severity=f.severity, name=f.name,
                       fixes=f.fixes)
        parts += [head_line(note), _hanging("  for ", for_whom(targets, checked), style="dim"), *finding_body(note)]
    return Group(*parts)


def fleet_table(results: list[Result]) -> Table:
    """One row per model: engine, errors, warnings and the code to look at first."""
    table = Table(title="Summary", title_justify="left", title_style="bold", box=SIMPLE_HEAD, padding=(0, 1))
    table.add_column("model", overflow="fold")
    table.add_column("engine", no_wrap=True)
    table.add_column("errors", justify="right")
    table.add_column("warnings", justify="right")
    table.add_column("top code", no_wrap=True)
    for row in fleet_rows(results):
        if row["error"] is not None:
            table.add_row(row["target"], row["engine"], "-", "-", Text("cannot check", style="red"))
            continue
        table.add_row(row["target"], row["engine"],
                      Text(str(row["errors"]), style="red" if row["errors"] else ""),
                      Text(str(row["warnings"]), style="yellow" if row["warnings"] else ""),
                      row["top_code"] or Text("clean", style="green"))
    return table


def render(results: list[Result], console: Console | None = None, parts: list[str] | None = None) -> None:
    """Every checked result's panel; with more than one target the notes and the summary table; the
    closing line.
    `parts`, when given, are the panels already rendered by panel_text with this console (and the same
    `fleet`), written as the console writes its own output."""
    console = console or Console()
    fleet = len(results) > 1
    for i, result in enumerate(results):
        if result.error:
            continue  # the command's one line on stderr says why; the table marks it
        if parts is None:
            console.print(result_panel(result, fleet))
        else:
            console.file.write(parts[i])
    if fleet:
        gathered = notes(results)
        if gathered is not None:
            console.print(gathered)
        console.print(fleet_table(results))
    console.print(closing_line(results), style="bold", markup=False, highlight=False)
