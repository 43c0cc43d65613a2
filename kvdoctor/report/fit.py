"""Views of a fit document (`kvdoctor.fit/1`): the terminal's table of memory terms per rank with their
sources, and a standalone HTML page with a stacked bar per rank (weights, activations, non-torch, CUDA
graphs, KV, free). Renders the document; never re-runs a stage."""
from __future__ import annotations

import html as _html
import io
import shlex
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

GIB = 1 << 30
SEGMENTS = (("weights", "#4e79a7"), ("activations", "#f28e2b"), ("non_torch", "#bab0ac"),
            ("cuda_graphs", "#e15759"), ("reserved", "#b07aa1"), ("kv", "#59a14f"), ("free", "#e8e8e8"))


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def layout_text(row: dict[str, Any]) -> str:
    parts = [f"{k}{v}" for k, v in row["layout"].items() if not isinstance(v, bool) and (v != 1 or k == "tp")]
    parts += ["ep" if k == "expert_parallel" else k.replace("_", "-") for k, v in row["layout"].items() if v is True]
    return " ".join(parts)


def verdict(row: dict[str, Any]) -> str:
    if row["refusal"]:
        return f"refused: {row['refusal']['class']}"
    return "serves" if row["fits"] else "too few requests"


def _term(row: dict[str, Any], name: str) -> int | None:
    return next((t["bytes"] for t in row["terms"] if t["name"] == name), None)


def rows_table(doc: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="memory of the fullest rank (GiB)", title_justify="left")
    for head in ("layout", "weights", "activ.", "graphs", "KV", "KV tokens",
                 f"x {doc['rows'][0]['context']:,}", "longest", ""):
        table.add_column(head, justify="left" if head in ("layout", "") else "right", no_wrap=head != "")
    for row in doc["rows"]:
        conc = row["max_concurrency"]
        table.add_row(layout_text(row), _gib(row["weights"]["bytes_per_rank"]), _gib(_term(row, "activations")),
                      _gib(_term(row, "cuda_graphs")), _gib(row["kv_bytes"]),
                      "-" if row["kv_tokens"] is None else f"{row['kv_tokens']:,}",
                      "-" if conc is None else f"{conc:.2f}",
                      "-" if row["max_context"] is None else f"{row['max_context']:,}", verdict(row))
    return table


def render(doc: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    m, i = doc["model"], doc["inputs"]
    console.print(Text(m["id"], style="bold") + Text(f" ({m['model_type']}, {m['layers']} layers) on {i['gpus']} x "
                                                      f"{i['gpu']} ({i['gpu_memory_bytes'] / GIB:.2f} GiB each) "
                                                      f"with {i['engine']}"))
    console.print(rows_table(doc))
    for row in doc["rows"]:
        if row["refusal"]:
            console.print(Text(f"{layout_text(row)}: {row['refusal']['class']}: {row['refusal']['message']}",
                               style="red"), soft_wrap=True)
    first = doc["rows"][0]
    console.print(Text("where each term comes from", style="bold"))
    for t in first["terms"]:
        console.print(f"  {t['name']:<12} {_gib(t['bytes']):>8} GiB  {t['source']}", markup=False, soft_wrap=True)
    best = doc["recommendation"]
    if best is None:
        console.print(Text("no layout of up to 8 GPUs of this kind serves the request", style="bold red"))
        return
    console.print(Text(f"recommended: {best['gpus']} x {best['gpu']}, {layout_text(best)}: "
                       f"{best['max_concurrency']:.2f} requests at {best['context']:,} tokens", style="bold green"))
    console.print("  " + shlex.join(best["launch"]), markup=False, soft_wrap=True)
    console.print(Text("deploy file (kvdoctor check --deploy gates on it):", style="bold"))
    console.print(deploy_yaml(doc, best), markup=False, soft_wrap=True)


def deploy_yaml(doc: dict[str, Any], row: dict[str, Any]) -> str:
    """The deploy file that asks for this row: the budget: section MEM016 checks, and the engine's section."""
    i = doc["inputs"]
    budget = {"gpu": row["gpu"], "gpus": row["gpus"], "context": row["context"]}
    if i.get("concurrency"):
        budget["concurrency"] = i["concurrency"]
    lines = ["engine: " + row["engine"], "budget:"] + [f"  {k}: {v}" for k, v in budget.items()]
    if row["deploy"]:
        lines += [row["engine"].replace("-", "_") + ":"] + [f"  {k}: {v}" for k, v in row["deploy"].items()]
    return "\n".join(lines)


def text(doc: dict[str, Any]) -> str:
    out = io.StringIO()
    render(doc, Console(file=out, width=160, color_system=None))
    return out.getvalue()


def _bar(row: dict[str, Any], stage_weights: int) -> str:
    total = row["gpu_memory_bytes"]
    values = {t["name"]: t["bytes"] for t in row["terms"]}
    values["weights"] = stage_weights
    cells = []
    for name, colour in SEGMENTS:
        value = values.get(name)
        if not value or value <= 0:
            continue
        width = 100 * value / total
        cells.append(f'<div class="seg" style="width:{width:.3f}%;background:{colour}" '
                     f'title="{name}: {value / GIB:.2f} GiB"></div>')
    return f'<div class="bar">{"".join(cells)}</div>'


def html(doc: dict[str, Any]) -> str:
    """A standalone page: per layout, one stacked bar per pipeline stage (every rank of a stage holds the
    same), then the terms with their sources and the launch command."""
    e = _html.escape
    m, i = doc["model"], doc["inputs"]
    legend = "".join(f'<span class="key" style="background:{c}"></span>{e(n)} ' for n, c in SEGMENTS)
    parts = [f"<h1>{e(m['id'])} on {i['gpus']} x {e(i['gpu'])} with {e(i['engine'])}</h1>",
             f'<p class="legend">{legend}</p>']
    rows = list(doc["rows"])
    if doc["recommendation"] is not None and doc["recommendation"] not in rows:
        rows.append(doc["recommendation"])
    for row in rows:
        status = e(verdict(row))
        parts.append(f"<h2>{e(layout_text(row))} ({row['gpus']} GPUs): {status}</h2>")
        for stage, weights in enumerate(row["weights"]["per_stage"]):
            label = f"stage {stage}" if len(row["weights"]["per_stage"]) > 1 else "each rank"
            parts.append(f'<div class="rank"><span>{label}</span>{_bar(row, weights)}</div>')
        terms = "".join(f"<tr><td>{e(t['name'])}</td><td>{t['bytes'] / GIB:.2f} GiB</td><td>{e(t['source'])}</td></tr>"
                        for t in row["terms"])
        parts.append(f"<table>{terms}</table>")
        if row["refusal"]:
            parts.append(f'<p class="error">{e(row["refusal"]["class"])}: {e(row["refusal"]["message"])}</p>')
        if row["launch"]:
            parts.append(f"<pre>{e(shlex.join(row['launch']))}</pre>")
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto}.bar{display:flex;height:1.4em;"
             "border:1px solid #999;flex:1}.seg{height:100%}.rank{display:flex;gap:1em;align-items:center;"
             "margin:.2em 0}.rank span{width:6em}.key{display:inline-block;width:1em;height:1em;margin:0 .3em}"
             "td{padding:0 1em 0 0;font-size:.9em}.error{color:#b00}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>kvdoctor fit: {e(m['id'])}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
