"""`--format html` / `--html-output FILE`: one self-contained page per run.

Everything is inline (CSS, a few lines of JS for the hover card, SVG bars), so the file can be
attached to a CI run or mailed and opened offline: it fetches nothing. With more than one model an
index comes first (one row per model, linked to its section's anchor). Per model: the summary, the
layer map (model kind over engine cache, one cell per layer carrying `data-layer`), a memory
picture, the findings with the catalog's text and fixes, and for a dry run the keys attended. The page
fits a 700 px window: the charts scale down, wide tables scroll in their own box.
"""
from __future__ import annotations

import json
from html import escape
from typing import Any

from kvdoctor import __version__
from kvdoctor.engines import is_reference
from kvdoctor.limits import DTYPE_BYTES
from kvdoctor.model import CHUNKED, FULL, SLIDING, Result
from kvdoctor.report import Report, fleet_rows, for_whom, shared_notes, span, summary, summary_line
from kvdoctor.report.versions import engine_line

KIND_COLOUR = {
    "full_attention": "#2e9d5b", "sliding_attention": "#2aa7c9", "chunked_attention": "#7fd3e8",
    "mla": "#3f5fd1", "mla_sparse": "#6b7fe0", "kda": "#b04fc0", "gated_deltanet": "#8a3d9e",
    "mamba": "#d6b02c", "linear_attention": "#7d4fb0", "attention+mamba": "#e8cf5f", "conv": "#c98a2a",
    "mlp": "#9aa0a6", "moe": "#b8bcc1", "none": "#d0d3d6",
}
CACHE_COLOUR = {  # every cache label an engine's plan gives (LayerPlan.cache); red only for "unknown"
    "full": "#2e9d5b", "contiguous": "#2e9d5b", "windowed": "#2aa7c9", "swa": "#2aa7c9", "rotating": "#2aa7c9",
    "chunked": "#7fd3e8", "mla": "#3f5fd1", "kda-replayssm": "#b04fc0", "state": "#d6b02c", "mamba": "#d6b02c",
    "native": "#c98a2a", "none": "#d0d3d6",
}
UNKNOWN = "#d93f3f"
SEVERITY_CLASS = {"error": "sev-error", "warning": "sev-warning", "info": "sev-info"}

CSS = """
:root { --fg:#1d2327; --muted:#5f6b73; --line:#dde3e8; --bg:#f6f8fa; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:var(--fg);
       background:var(--bg); }
header { padding:18px 28px; background:#1d2327; color:#fff; }
header h1 { margin:0 0 4px; font-size:20px; }
header p { margin:0; color:#c5ced6; }
main { padding:18px 28px 40px; max-width:1200px; }
section.model { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:16px 20px;
                margin:0 0 22px; }
h2 { margin:0 0 10px; font-size:17px; word-break:break-all; }
h3 { margin:18px 0 8px; font-size:14px; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); }
table.summary td { padding:2px 14px 2px 0; vertical-align:top; }
table.summary td:first-child { color:var(--muted); white-space:nowrap; }
.badges span { display:inline-block; padding:1px 8px; border-radius:10px; margin-right:6px; font-size:12px;
               font-weight:600; }
.sev-error { background:#fde2e1; color:#a61b1b; } .sev-warning { background:#fff1cc; color:#7a5600; }
.sev-info { background:#dfeefe; color:#1b4f8a; }
.strip { display:flex; flex-wrap:wrap; gap:2px; margin:6px 0 4px; }
.cell { width:16px; height:34px; display:flex; flex-direction:column; border-radius:3px; overflow:hidden;
        outline:1px solid rgba(0,0,0,.08); cursor:default; position:relative; }
.cell i { flex:1; display:block; }
.cell.off { outline:2px solid #d93f3f; }
.cell.flag::after { content:""; position:absolute; top:2px; left:5px; width:6px; height:6px; border-radius:3px;
                    background:#fff; border:1px solid #a61b1b; }
.cell:hover { outline:2px solid #1d2327; }
.rows { font-size:12px; color:var(--muted); }
.legend { display:flex; flex-wrap:wrap; gap:4px 14px; font-size:12px; margin-top:6px; }
.legend b { display:inline-block; width:11px; height:11px; border-radius:2px; margin-right:4px;
            vertical-align:-1px; }
#tip { position:fixed; display:none; pointer-events:none; background:#1d2327; color:#fff; padding:8px 10px;
       border-radius:6px; font:12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; white-space:pre;
       z-index:10; box-shadow:0 4px 14px rgba(0,0,0,.25); }
table.data { border-collapse:collapse; margin:4px 0; font-size:13px; }
table.data th, table.data td { border-bottom:1px solid var(--line); padding:3px 10px 3px 0; text-align:left;
                               vertical-align:top; }
table.data td.n, table.data th.n { text-align:right; font-variant-numeric:tabular-nums; }
svg text { font:11px system-ui, sans-serif; fill:var(--fg); }
.finding { border-left:4px solid var(--line); padding:6px 12px; margin:10px 0; background:#fbfcfd; }
.finding.error { border-color:#d93f3f; } .finding.warning { border-color:#e0a800; }
.finding.info { border-color:#3d84d6; }
.finding .head { font-weight:600; } .finding .head code { font-size:13px; }
.finding .where { color:var(--muted); font-weight:400; margin-left:6px; }
.finding p { margin:4px 0; } .finding ul { margin:4px 0; padding-left:20px; }
.finding .engine-error { color:#a61b1b; font-family:ui-monospace, monospace; font-size:12px; }
pre { background:#f0f3f6; padding:6px 8px; border-radius:4px; overflow-x:auto; font-size:12px; margin:4px 0; }
details summary { cursor:pointer; color:var(--muted); }
.note { color:var(--muted); font-size:12px; }
.error-box { color:#a61b1b; }
svg.bars, svg.keys { display:block; max-width:100%; height:auto; }
.scroll { overflow-x:auto; }
nav.index { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 20px;
            margin:0 0 22px; }
nav.index h2 { font-size:15px; }
nav.index td:first-child a { word-break:break-all; }
@media (max-width: 760px) {
  header, main { padding-left:12px; padding-right:12px; }
  section.model, nav.index { padding:12px; }
}
"""

JS = """
(function () {
  var tip = document.getElementById('tip');
  document.addEventListener('mouseover', function (e) {
    var cell = e.target.closest ? e.target.closest('.cell') : null;
    if (!cell) { tip.style.display = 'none'; return; }
    tip.textContent = cell.getAttribute('data-tip');
    tip.style.display = 'block';
  });
  document.addEventListener('mousemove', function (e) {
    if (tip.style.display !== 'block') return;
    var x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    var y = e.clientY + 18 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 10 : e.clientY + 18;
    tip.style.left = x + 'px'; tip.style.top = y + 'px';
  });
})();
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else _e(value)


# ---- summary -------------------------------------------------------------------------------------

def _summary(result: Result) -> str:
    info = result.info
    rows = [("model_type", f"{result.model_type} (family: {info.get('family')})"),
            ("layers", info.get("num_hidden_layers")), ("dtype", info.get("dtype") or "-")]
    ckpt = info.get("checkpoint")
    rows.append(("checkpoint", "none (config checks only)" if not ckpt else
                 f"{ckpt['tensors']:,} tensors in {ckpt['files']} file(s), {ckpt['bytes'] / 2**30:.2f} GiB "
                 "(headers read)"))
    rows.append(("engine", engine_line(result.engine, result.engine_versions, result.info.get("release"))))
    for key, value in (info.get("defaults") or {}).items():
        rows.append(("default", f"{key} = {value!r} (absent from config.json; the family default)"))
    rows += [("note", note) for note in info.get("notes") or []]
    rows += [("engine note", note) for note in info.get("engine_notes") or []]
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _badges(result: Result) -> str:
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in SEVERITY_CLASS}
    return '<div class="badges">' + "".join(
        f'<span class="{SEVERITY_CLASS[s]}">{n} {s}{"s" if n != 1 and s != "info" else ""}</span>'
        for s, n in counts.items()) + "</div>"


# ---- the layer map -------------------------------------------------------------------------------

def _state_text(state: dict[str, Any]) -> list[str]:
    lines = []
    for tp, shapes in sorted(state.items(), key=lambda kv: int(kv[0])):
        parts = [f"{name} {shape}" for name, shape in shapes.items() if name != "bytes_per_slot"]
        lines.append(f"state tp{tp}: " + ", ".join(parts) + f"; {shapes.get('bytes_per_slot', 0):,} B/slot")
    return lines


def _tip(result: Result, row: dict[str, Any], codes: list[str]) -> str:
    lines = [f"layer {row['index']}", f"kind    {row['kind']}", f"window  {row['window'] or 'full'}"]
    if row.get("heads") is not None:
        lines.append(f"heads   {row['heads']} q / {row.get('kv_heads')} kv x {row.get('head_dim')}"
                     + (f" ({row['dtype']})" if row.get("dtype") else ""))
    if not is_reference(result.engine):
        lines.append(f"{result.engine}: cache {row.get('cache') or 'none'}, "
                     f"window {row.get('engine_window') or 'full'}")
    if row.get("state"):
        lines += _state_text(row["state"])
    if codes:
        lines.append("findings: " + ", ".join(codes))
    return "\n".join(lines)


def _mismatch(row: dict[str, Any], engine: str) -> bool:
    return not is_reference(engine) and row.get("cache") not in (None, "none") and row["window"] != row.get("engine_window")


def layer_map(result: Result) -> str:
    by_layer: dict[int, list[str]] = {}
    for f in result.findings:
        if f.layer is not None:
            by_layer.setdefault(f.layer, []).append(f.code)
    cells = []
    for row in result.layers:
        kind = KIND_COLOUR.get(row["kind"], UNKNOWN)
        classes = ["cell"] + (["off"] if _mismatch(row, result.engine) else []) + \
            (["flag"] if row["index"] in by_layer else [])
        halves = f'<i style="background:{kind}"></i>'
        if not is_reference(result.engine):
            halves += f'<i style="background:{CACHE_COLOUR.get(row.get("cache") or "none", UNKNOWN)}"></i>'
        cells.append(f'<div class="{" ".join(classes)}" data-layer="{row["index"]}" data-kind="{_e(row["kind"])}" '
                     f'data-cache="{_e(row.get("cache") or "")}" '
                     f'data-tip="{_e(_tip(result, row, by_layer.get(row["index"], [])))}">{halves}</div>')
    rows = "top: the model's layer kind" + ("" if is_reference(result.engine) else
                                             f"; bottom: the cache {_e(result.engine)} builds")
    legend = []
    kinds = dict.fromkeys(row["kind"] for row in result.layers)
    for kind in kinds:
        count = sum(1 for row in result.layers if row["kind"] == kind)
        legend.append(f'<span><b style="background:{KIND_COLOUR.get(kind, UNKNOWN)}"></b>{_e(kind)} &times;{count}'
                      "</span>")
    if not is_reference(result.engine):
        for cache in dict.fromkeys(row.get("cache") or "none" for row in result.layers):
            count = sum(1 for row in result.layers if (row.get("cache") or "none") == cache)
            legend.append(f'<span><b style="background:{CACHE_COLOUR.get(cache, UNKNOWN)}"></b>{_e(result.engine)} '
                          f'{_e(cache)} &times;{count}</span>')
    off = sum(1 for row in result.layers if _mismatch(row, result.engine))
    if off:
        legend.append(f'<span><b style="outline:2px solid #d93f3f;background:#fff"></b>{off} layer(s) whose engine '
                      "window differs from the model's</span>")
    if by_layer:
        legend.append("<span>&#9675; a finding names this layer</span>")
    windows = sorted({row["window"] for row in result.layers if row["window"]})
    if windows:
        legend.append(f"<span>model window {', '.join(map(str, windows))}</span>")
    return (f'<div class="rows">{rows} (hover a cell for details)</div>'
            f'<div class="strip" data-layers="{len(result.layers)}">{"".join(cells)}</div>'
            f'<div class="legend">{"".join(legend)}</div>')


def state_table(result: Result) -> str:
    rows = [row for row in result.layers if row.get("state")]
    if not rows:
        return ""
    groups: dict[str, tuple[dict, list[int]]] = {}
    for row in rows:
        groups.setdefault(json.dumps(row["state"], sort_keys=True), (row["state"], []))[1].append(row["index"])
    body = []
    for state, indices in groups.values():
        for line in _state_text(state):
            body.append(f"<tr><td>{_e(span(indices))}</td><td>{_e(line)}</td></tr>")
    return ('<h3>State caches per slot</h3><div class="scroll"><table class="data"><tr><th>layers</th><th>shapes '
            f'(slot dimension left out)</th></tr>{"".join(body)}</table></div>')


def _bars(items: list[tuple[str, float, str, str]], width: int = 640, unit: str = "") -> str:
    """Horizontal SVG bars: (label, value, value text, colour)."""
    if not items:
        return ""
    top = max(value for _, value, _, _ in items) or 1
    label_w, row_h = min(340, 12 + 6 * max(len(label) for label, _, _, _ in items)), 22
    height = row_h * len(items) + 4
    out = [f'<svg class="bars" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for i, (label, value, text, colour) in enumerate(items):
        y = i * row_h + 2
        bar = max(1.0, (width - label_w - 110) * value / top) if value else 0
        out.append(f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end">{_e(label)}</text>'
                   f'<rect x="{label_w}" y="{y + 3}" width="{bar:.1f}" height="{row_h - 8}" rx="2" fill="{colour}">'
                   f'<title>{_e(label)}: {_e(text)}</title></rect>'
                   f'<text x="{label_w + bar + 6:.1f}" y="{y + 14}">{_e(text)}{_e(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


KV_KINDS = (FULL, SLIDING, CHUNKED)
# The model dtypes whose K and V bytes the page shows without a budget (widths from limits.DTYPE_BYTES)
SHOWN_DTYPES = ("float32", "float16", "bfloat16", "F32", "F16", "BF16", "fp8", "F8_E4M3")


def _model_bytes(result: Result) -> list[tuple[str, int, int]]:
    """(kind, layers, K+V bytes per token per layer) for the plain attention kinds (one K and one V
    row per token and KV head) whose heads and dtype are known; latent and state layers are left to
    the budget's own figures."""
    out: dict[tuple[str, int], int] = {}
    for row in result.layers:
        dtype = row.get("dtype") or result.info.get("dtype") or ""
        width = DTYPE_BYTES[dtype] if dtype in SHOWN_DTYPES else None
        if row["kind"] in KV_KINDS and row.get("kv_heads") and row.get("head_dim") and width:
            key = (row["kind"], 2 * row["kv_heads"] * row["head_dim"] * width)
            out[key] = out.get(key, 0) + 1
    return [(kind, layers, per) for (kind, per), layers in out.items()]


def memory(result: Result, budget: dict[str, Any] | None, budget_error: str | None) -> str:
    parts = ["<h3>Memory</h3>"]
    if budget is None:
        kinds = _model_bytes(result)
        if kinds:
            parts.append('<p class="note">K and V bytes per token, at the model\'s dtype and head shapes, before any '
                         "engine's paging (pass --kv-budget for each engine's own figures and the tokens that "
                         "fit)</p>")
            parts.append(_bars([(f"{kind} x{layers} ({per:,} B/layer)", layers * per, f"{layers * per:,} B/token",
                                 KIND_COLOUR.get(kind, UNKNOWN)) for kind, layers, per in kinds]))
        others = {row["kind"] for row in result.layers if row["kind"] not in KV_KINDS and row["kind"] not in
                  ("mlp", "moe", "none")}
        if others:
            parts.append(f'<p class="note">{_e(", ".join(sorted(others)))} layers keep a latent cache or a recurrent '
                         "state, not one K and V row per head: pass --kv-budget for the engines' figures"
                         + ("; the state shapes per slot are above" if any(r.get("state") for r in result.layers)
                            else "") + "</p>")
        if budget_error:
            parts.append(f'<p class="note error-box">--kv-budget: {_e(budget_error)}</p>')
        return "".join(parts) if len(parts) > 1 else ""
    from kvdoctor.engines.budget.common import size
    from kvdoctor.report.budget import mode_labels, tokens_fit

    first: dict[str, dict[str, Any]] = {}  # each engine's default mode (its first row)
    for row in budget["engines"]:
        if not row.get("error"):
            first.setdefault(row["engine"], row)
    kinds = list(dict.fromkeys(k["kind"] for row in first.values() for k in row["layer_kinds"]))
    head = "".join(f"<th class=n>{_e(name)} {_e(row['version'])}</th>" for name, row in first.items())
    rows = []
    for kind in kinds:
        cells = []
        for row in first.values():
            k = next((k for k in row["layer_kinds"] if k["kind"] == kind), None)
            per = None if k is None else k.get("bytes_per_token_per_layer")
            cells.append(f"<td class=n>{'-' if k is None else _n(per) if per else 'state'}</td>")
        layers = budget["model"]["layer_kinds"].get(kind, "")
        rows.append(f"<tr><td>{_e(kind)}</td><td class=n>{_n(layers)}</td>{''.join(cells)}</tr>")
    parts.append('<div class="scroll"><table class="data"><tr><th>bytes per token per layer</th><th class=n>layers'
                 f'</th>{head}</tr>{"".join(rows)}</table></div>')
    kv = budget["engines"][0]["budget"]["kv_budget_bytes"] if budget["engines"] else 0
    parts.append(f'<p class="note">Tokens of KV that fit in {_e(size(kv))} at context '
                 f'{_n(budget["inputs"]["context"])}, per engine and mode (mlx-lm has no pool: whole requests '
                 "times their length)</p>")
    colours = {"vllm": "#3d84d6", "sglang": "#e0803a", "mlx-lm": "#6a4fb0"}
    bars = []
    for row, mode in zip(budget["engines"], mode_labels(budget["engines"])):
        fit = tokens_fit(row)
        label = f"{row['engine']}: {mode}"
        bars.append((label if len(label) < 52 else label[:50] + "…", fit or 0,
                     "refused" if fit is None else f"{fit:,} tokens", colours.get(row["engine"], UNKNOWN)))
    parts.append(_bars(bars, width=820))
    return "".join(parts)


# ---- findings ------------------------------------------------------------------------------------

def _finding(report: Report, result: Result, f) -> str:
    path, line = report.location(result, f)
    where = f"{path}{':' + str(line) if line else ''}" + (f", layer {f.layer}" if f.layer is not None else "")
    out = [f'<div class="finding {f.severity}"><div class="head"><code>{_e(f.code)}</code> '
           f'<span class="{SEVERITY_CLASS[f.severity]}" style="padding:0 6px;border-radius:8px">{_e(f.severity)}</span> '
           f'{_e(f.name)}<span class="where">{_e(where)}</span></div><p>{_e(f.message)}</p>']
    if f.engine_error:
        err = f.engine_error
        said = "the message above" if err.get("message") == f.message else err.get("message")
        out.append(f'<p class="engine-error">engine would raise at {_e(err.get("stage"))}: {_e(err.get("class"))}: '
                   f'{_e(said)}</p>')
    out.append("<ul>" + "".join(f"<li>fix: {_e(fix)}</li>" for fix in f.fixes) + "</ul>")
    entry = report.catalog.description(f.code)
    if entry is not None:
        examples = "".join(
            f"<p>{_e(fix.summary)}</p>" + (f"<pre>{_e(fix.before)}</pre>" if fix.before else "")
            + (f"<pre>{_e(fix.after)}</pre>" if fix.after else "") for fix in entry.fixes if fix.before or fix.after)
        refs = "".join(f'<li><a href="{_e(r)}">{_e(r)}</a></li>' if r.startswith("https://") else f"<li>{_e(r)}</li>"
                       for r in entry.references)
        out.append(f"<details><summary>{_e(entry.summary)}</summary><p>{_e(' '.join(entry.meaning.split()))}</p>"
                   + examples + (f"<p>References:</p><ul>{refs}</ul>" if refs else "") + "</details>")
    out.append("</div>")
    return "".join(out)


# ---- dry run -------------------------------------------------------------------------------------

def fit_bars(result: Result) -> str:
    """The memory of the fullest rank for each MEM016 finding (the deploy file's GPUs do not serve what it
    asks): one stacked bar of the engine's terms, as `kvdoctor fit --format html` draws them."""
    from kvdoctor.report.fit import SEGMENTS

    parts = []
    for f in result.findings:
        evidence = f.evidence or {}
        if f.code != "MEM016" or not evidence.get("gpu_memory_bytes"):
            continue
        total = evidence["gpu_memory_bytes"]
        cells = "".join(
            f'<div style="width:{100 * t["bytes"] / total:.3f}%;background:{colour};height:100%" '
            f'title="{_e(t["name"])}: {t["bytes"] / (1 << 30):.2f} GiB"></div>'
            for name, colour in SEGMENTS for t in evidence.get("terms", []) if t["name"] == name and t["bytes"] > 0)
        legend = ", ".join(f'{_e(t["name"])} {t["bytes"] / (1 << 30):.2f} GiB' for t in evidence.get("terms", []))
        parts.append(f'<div class="fit-bar" style="display:flex;height:1.2em;border:1px solid #999">{cells}</div>'
                     f'<p class="note">{legend}</p>')
    return f"<h3>Memory of the fullest rank (MEM016)</h3>{''.join(parts)}" if parts else ""


def dry_run(result: Result) -> str:
    run = result.info.get("dry_run")
    if not run:
        return ""
    head = ["<h3>Dry run</h3>"]
    if not run.get("ran"):
        return "".join(head) + f'<p class="note">not run: {_e(run.get("reason") or run.get("outcome"))}</p>'
    stages = ", ".join(f"{k} {v}" for k, v in (run.get("stages") or {}).items())
    head.append(f'<p class="note">{_e(run.get("outcome"))} in {_e(run.get("seconds"))} s; stages: {_e(stages)}</p>')
    layers = [row for row in run.get("layers") or [] if row.get("prefill_max_keys") or row.get("decode_keys")]
    if not layers:
        return "".join(head)
    decode = {row["index"]: _most(row.get("decode_keys")) for row in layers}
    top = max(max(row.get("prefill_max_keys", 0), decode[row["index"]]) for row in layers) or 1
    w, h, pad = max(480, 14 * len(layers) + 60), 160, 52
    step = (w - pad - 10) / len(layers)
    svg = [f'<svg width="{w}" height="{h + 18}" viewBox="0 0 {w} {h + 18}" role="img" class="keys">',
           f'<text x="{pad - 6}" y="{h}" text-anchor="end">0</text>'
           f'<text x="{pad - 6}" y="26" text-anchor="end">{top:,}</text>'
           f'<text x="{pad - 6}" y="{h + 14}" text-anchor="end">layer</text>']
    for i, row in enumerate(layers):
        x = pad + i * step
        prefill = row.get("prefill_max_keys", 0)
        for value, dx, colour, label in ((prefill, 0, "#3d84d6", "most keys a prefill query attended"),
                                         (decode[row["index"]], step / 2, "#e0803a", "most keys at a decode step")):
            bh = (h - 22) * value / top
            svg.append(f'<rect x="{x + dx:.1f}" y="{h - bh:.1f}" width="{max(1.0, step / 2 - 1):.1f}" '
                       f'height="{bh:.1f}" fill="{colour}"><title>layer {row["index"]}: {label} {value:,}'
                       f'{"; engine window " + str(row["engine_window"]) if row.get("engine_window") else ""}'
                       "</title></rect>")
        if row.get("engine_window"):
            wy = h - (h - 22) * row["engine_window"] / top
            svg.append(f'<line x1="{x:.1f}" x2="{x + step - 1:.1f}" y1="{wy:.1f}" y2="{wy:.1f}" stroke="#1d2327" '
                       f'stroke-width="1.5"><title>layer {row["index"]}: engine window {row["engine_window"]:,}'
                       "</title></line>")
        if i % max(1, len(layers) // 12) == 0:
            svg.append(f'<text x="{x:.1f}" y="{h + 14}">{row["index"]}</text>')
    svg.append("</svg>")
    caption = ('<p class="note">keys attended per layer (hover a bar): blue, the most keys a prefill query attended; '
               "orange, the most at a decode step; black line, the engine's window</p>")
    return "".join(head + svg) + caption


def _most(values: Any) -> int:
    """The largest number in a (nested) list of key counts."""
    if isinstance(values, (list, tuple)):
        return max((_most(v) for v in values), default=0)
    return values if isinstance(values, int) else 0


# ---- the page ------------------------------------------------------------------------------------

def anchor(index: int) -> str:
    """The id of the index-th result's section (from 1): the index links to it, and so can a CI log."""
    return f"model-{index}"


def model_section(report: Report, result: Result, index: int = 1, fleet: bool = False) -> str:
    """One model's section; in a fleet (`fleet`) a note is one line linking to the notes after the models."""
    title = f'<h2>{_e(result.target)}</h2>'
    opening = f'<section class="model" id="{anchor(index)}" data-target="{_e(result.target)}">{title}'
    if result.error:
        return f'{opening}<p class="error-box">cannot check: {_e(result.error)}</p></section>'
    findings = "".join(_note_line(f) if fleet and f.severity == "info" else _finding(report, result, f)
                       for f in result.findings) or '<p class="note">no findings</p>'
    return (f"{opening}{_badges(result)}{_summary(result)}"
            f"<h3>Layer map</h3>{layer_map(result)}{state_table(result)}{memory(result, result.budget, result.budget_error)}"
            f"{fit_bars(result)}{dry_run(result)}<h3>Findings</h3>{findings}</section>")


def _note_line(f) -> str:
    return (f'<div class="finding info"><div class="head"><code>{_e(f.code)}</code> {_e(f.name)} '
            f'<a href="#notes">(in the notes after the models)</a></div></div>')


def notes(report: Report) -> str:
    """A fleet's notes, each written once with the models (and layers) it was given for."""
    groups = shared_notes(report.results)
    if not groups:
        return ""
    checked = {r.target for r in report.results if not r.error}
    by_target = {r.target: r for r in report.results}
    items = "".join(f'<p class="note">for {_e(for_whom(targets, checked))}</p>'
                    + _finding(report, by_target[next(iter(targets))], f) for f, targets in groups)
    return f'<section class="model" id="notes"><h2>Notes</h2>{items}</section>'


def index(report: Report) -> str:
    """One row per model, linked to its section: engine, errors, warnings, the code to look at first."""
    rows = []
    for i, row in enumerate(fleet_rows(report.results), 1):
        link = f'<a href="#{anchor(i)}">{_e(row["target"])}</a>'
        if row["error"] is not None:
            rows.append(f'<tr><td>{link}</td><td>{_e(row["engine"])}</td><td class=n>-</td><td class=n>-</td>'
                        '<td class="error-box">cannot check</td></tr>')
            continue
        rows.append(f'<tr><td>{link}</td><td>{_e(row["engine"])}</td><td class=n>{row["errors"]}</td>'
                    f'<td class=n>{row["warnings"]}</td><td>{_e(row["top_code"] or "clean")}</td></tr>')
    return ('<nav class="index"><h2>Models</h2><div class="scroll"><table class="data"><tr><th>model</th>'
            '<th>engine</th><th class=n>errors</th><th class=n>warnings</th><th>top code</th></tr>'
            f'{"".join(rows)}</table></div></nav>')


def render(report: Report) -> str:
    counts = summary(report.results)
    fleet = len(report.results) > 1
    body = "".join(model_section(report, r, i, fleet) for i, r in enumerate(report.results, 1))
    if fleet:
        body = index(report) + body + notes(report)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>kvdoctor report: {counts['targets']} target(s)</title><style>{CSS}</style></head><body>"
            f"<header><h1>kvdoctor report</h1><p>{_e(summary_line(report))} &middot; kvdoctor {_e(__version__)}"
            f"</p></header><main>{body}</main><div id=\"tip\"></div><script>{JS}</script></body></html>")
