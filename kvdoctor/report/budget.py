"""The terminal view of a budget document: one compact table per model (a row per engine and mode),
a bar chart of the tokens that fit, the findings; with --verbose, a detail table per engine."""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from kvdoctor.engines import profile
from kvdoctor.engines.budget.common import BudgetView, n, size

UNITS = {
    "request_tokens_at_L": "concurrency x max_model_len (vLLM's 'GPU KV cache size')",
    "pool_tokens": "tokens in SGLang's pools, shared by all running requests",
    "requests": "whole requests of this length; mlx-lm has no pool or admission control",
}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "blue"}


def view(row: dict[str, Any]) -> BudgetView:
    """The row in its engine's own terms (the engine's profile reads its fields)."""
    return profile(row["engine"]).budget_view(row)


def mode_text(row: dict[str, Any]) -> str:
    return "\n".join(view(row).mode)


def kinds_text(row: dict[str, Any]) -> str:
    lines = []
    for k in row["layer_kinds"]:
        label = f"{k['kind']} x{k['layers']}"
        if k.get("spec") == "FullAttentionSpec" and k["kind"] == "sliding":
            label += " as full"
        if k.get("window"):
            label += f" w{k['window']}"
        if k.get("max_size"):
            label += f" ring {k['max_size']}"
        per_token = k.get("bytes_per_token_per_layer")
        lines.append(f"{label}: {n(per_token)} B" if per_token else f"{label}: state")
    return "\n".join(lines) or "-"


def layout_text(row: dict[str, Any]) -> str:
    return view(row).layout


def state_text(row: dict[str, Any]) -> str:
    return view(row).state if row.get("state") else "-"


def capacity_text(row: dict[str, Any]) -> Text:
    if row.get("error"):
        err = row["error"]
        message = err["message"] if len(err["message"]) < 160 else err["message"][:157] + "..."
        return Text(f"{err['class']}: {message}", style="bold red")
    return Text(view(row).capacity)


def tokens_fit(row: dict[str, Any]) -> int | None:
    """Tokens of KV this engine and mode holds within the budget (vLLM's GPU KV cache size, SGLang's
    pool, mlx-lm's whole requests that fit times their length); None when the engine refuses."""
    return None if row.get("error") else view(row).tokens


SHORT_OMIT = ("block ", "in-flight ", "tp 1", "page 1", "kv_bits None", "max_kv_size None")


def _omittable(part: str) -> bool:
    return part.startswith(SHORT_OMIT[:2]) or part in SHORT_OMIT[2:]


def mode_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Each mode on one line. A block size, an in-flight count or a setting at 1 or None is left out
    when every mode of that engine shares it, so the rows stay short and still tell modes apart."""
    parts = [mode_text(row).splitlines() for row in rows]
    common: dict[str, set[str]] = {}
    for row, mine in zip(rows, parts):
        common[row["engine"]] = common.get(row["engine"], set(mine)) & set(mine)
    return [", ".join(p for p in mine if not (_omittable(p) and p in common[row["engine"]])) or mine[0]
            for row, mine in zip(rows, parts)]


def findings_text(row: dict[str, Any]) -> Text:
    text = Text()
    for f in row.get("findings", []):
        if text:
            text.append("\n")
        text.append(f["code"], style=SEVERITY_STYLE.get(f["severity"], ""))
    return text


def _contexts(row: dict[str, Any]) -> str:
    """How many requests of the full context length fit at once."""
    c = row["capacity"]
    value = c.get("concurrency_at_L", c.get("max_concurrency"))
    return "-" if value is None else f"{value:.2f}"


def _budget_line(rows: list[dict[str, Any]]) -> str:
    budgets = {(r["budget"]["source"], r["budget"]["kv_budget_bytes"], r["budget"].get("how")) for r in rows}
    if len(budgets) == 1:
        source, value, how = budgets.pop()
        return f"KV budget {size(value)}" + (" (given)" if source == "user" else f" (ESTIMATED: {how})")
    return "KV budget ESTIMATED per engine: " + "; ".join(
        f"{r['engine']} {size(r['budget']['kv_budget_bytes'])} ({r['budget'].get('how')})"
        for r in {r["engine"]: r for r in rows}.values())


def summary_table(doc: dict[str, Any]) -> Table:
    """One row per engine and mode: the tokens that fit, the full-length requests, the findings."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    table.add_column("engine", no_wrap=True)
    table.add_column("mode", overflow="fold")
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("x L", justify="right", no_wrap=True)
    table.add_column("findings", overflow="fold")
    last = None
    for row, label in zip(doc["engines"], mode_labels(doc["engines"])):
        engine = "" if row["engine"] == last else f"{row['engine']} {row['version']}"
        last = row["engine"]
        fit = tokens_fit(row)
        table.add_row(engine, label,
                      Text("refused", style="bold red") if fit is None else Text(n(fit)),
                      "-" if fit is None else _contexts(row),
                      findings_text(row) if row.get("findings") else Text("-", style="dim"))
    return table


BLOCKS = " ▏▎▍▌▋▊▉█"


def _bar(value: int, top: int, width: int) -> str:
    eighths = round(8 * width * value / top) if top else 0
    return "█" * (eighths // 8) + (BLOCKS[eighths % 8] if eighths % 8 else "")


def bar_chart(doc: dict[str, Any], width: int) -> Table:
    """Tokens that fit per engine and mode as bars scaled to the largest."""
    fits = [tokens_fit(row) for row in doc["engines"]]
    top = max((f for f in fits if f is not None), default=0)
    labels = [f"{row['engine']} {label}" for row, label in zip(doc["engines"], mode_labels(doc["engines"]))]
    label_width = min(36, max(len(label) for label in labels))
    value_width = max(len(n(f)) if f is not None else 7 for f in fits)
    bar_width = max(10, width - label_width - value_width - 4)
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True, width=label_width, overflow="ellipsis")
    table.add_column(no_wrap=True, width=bar_width)
    table.add_column(justify="right", no_wrap=True)
    for row, label, fit in zip(doc["engines"], labels, fits):
        bar = Text("refused", style="red") if fit is None else Text(_bar(fit, top, bar_width), style=view(row).colour)
        table.add_row(label, bar, "-" if fit is None else n(fit))
    return table


def _hanging(head: Text, body: str) -> Table:
    grid = Table.grid()
    grid.add_column(width=head.cell_len, no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(head, body)
    return grid


def render(doc: dict[str, Any], console: Console | None = None, verbose: bool = False) -> None:
    console = console or Console()
    model = doc["model"]
    kinds = ", ".join(f"{v} {k}" for k, v in model["layer_kinds"].items())
    console.print(Text(f"{model['id']}", style="bold") +
                  Text(f" ({model['model_type']}): {model['layers']} layers: {kinds}"))
    console.print(f"context L = {n(doc['inputs']['context'])} tokens; {_budget_line(doc['engines'])}", markup=False)
    console.print()
    console.print(summary_table(doc))
    console.print()
    console.print(Text("tokens: that fit (vLLM's GPU KV cache size, SGLang's pool, mlx-lm's whole requests x L); "
                       "x L: requests of the full context at once", style="dim"))
    console.print()
    console.print(Text("tokens that fit", style="bold"))
    console.print(bar_chart(doc, console.width))
    if verbose:
        render_details(doc, console)
    console.print()
    for row in doc.get("not_priced", []):
        console.print(_hanging(Text(f"{row['engine']}: not priced ", style="yellow"), row["why"]))
    seen = set()
    for row in doc["engines"]:
        for f in row.get("findings", []):
            key = (f["code"], f["message"])
            if key not in seen:
                seen.add(key)
                console.print(_hanging(Text(f"{f['code']} ", style=SEVERITY_STYLE.get(f["severity"], "")),
                                       f"{f['name']}: {f['message']}"))
    if not verbose:
        console.print(Text("(--verbose: groups, pools, state and capacity per engine)", style="dim"))


def render_details(doc: dict[str, Any], console: Console) -> None:
    """Per engine and mode: bytes per token per layer kind, groups or pools, state, capacity, as
    label and value lines that read at any width."""
    by_engine: dict[str, list[dict]] = {}
    for row in doc["engines"]:
        by_engine.setdefault(row["engine"], []).append(row)
    for engine, rows in by_engine.items():
        first = rows[0]
        budget = first["budget"]
        source = "given" if budget["source"] == "user" else "ESTIMATED: " + budget["how"]
        console.print()
        console.print(Text(f"{engine} {first['version']}: KV budget {size(budget['kv_budget_bytes'])} ({source})",
                           style="bold"))
        console.print(Text(f"capacity unit: {UNITS[first['capacity']['unit']]}", style="dim"))
        for row in rows:
            fit = row["capacity"].get("max_model_len_fit", row["capacity"].get("max_context_fit"))
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="dim", no_wrap=True)
            grid.add_column(overflow="fold")
            for label, value in (("bytes/token/layer", kinds_text(row)), ("groups / pools", layout_text(row)),
                                 ("state", state_text(row)), ("capacity", capacity_text(row)),
                                 ("largest context", "-" if fit is None else n(fit))):
                text = value if isinstance(value, Text) else Text(value)
                grid.add_row(label, Text("; ").join(text.split("\n")))
            console.print(Text("  " + ", ".join(mode_text(row).splitlines()), style="cyan"))
            console.print(Padding(grid, (0, 0, 0, 4)))
