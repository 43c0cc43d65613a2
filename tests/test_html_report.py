"""`--format html` / `--html-output`: one self-contained page, checked as text and rendered in a real
headless Chromium (Debian's `chromium`; `make test` installs it): the page loads with no console
message, and the layer strip has one cell per layer, in order, with the engine's cache on each."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from helpers import make_model, run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CELL = re.compile(r'<div class="cell[^"]*" data-layer="(\d+)" data-kind="([^"]*)" data-cache="([^"]*)"')


def _broken(cfg: dict) -> None:
    cfg["layer_types"] = cfg["layer_types"][:-1]  # the demo's broken copy: one entry short


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """The demo pair (gpt-oss-20b and its broken copy) checked under sglang-mlx with a KV budget."""
    tmp = tmp_path_factory.mktemp("html")
    healthy = make_model(tmp, "gpt-oss-20b", dirname="gpt-oss-20b")
    broken = make_model(tmp, "gpt-oss-20b", edit=_broken, dirname="gpt-oss-20b-broken")
    page = tmp / "report.html"
    proc = run("check", str(healthy), str(broken), "--engine", "sglang-mlx", "--kv-budget", "40GiB",
               "--html-output", str(page), "--json-output", str(tmp / "report.json"), "--format", "concise")
    assert proc.returncode == 1, proc.stderr  # the broken copy has errors
    budget = run("budget", str(healthy), "--kv-budget", "40GiB", "--format", "json")
    assert budget.returncode == 0, budget.stderr
    return {"dir": tmp, "page": page, "html": page.read_text(), "doc": json.loads((tmp / "report.json").read_text()),
            "budget": json.loads(budget.stdout)}


def _sections(html: str) -> list[str]:
    return html.split('<section class="model"')[1:]


def test_page_is_self_contained(demo):
    html = demo["html"]
    assert html.startswith("<!DOCTYPE html>")
    for fetch in (r"<script[^>]+src=", r"<link\b", r"<img\b", r"<iframe\b", r"url\(", r"@import", r"\bsrc="):
        assert not re.search(fetch, html, re.IGNORECASE), fetch
    assert "<style>" in html and "<script>" in html and "<svg" in html


def test_one_strip_cell_per_layer_with_kind_and_cache(demo):
    sections = _sections(demo["html"])
    assert len(sections) == len(demo["doc"]["results"]) == 2
    for section, result in zip(sections, demo["doc"]["results"]):
        cells = CELL.findall(section)
        assert [int(i) for i, _, _ in cells] == [row["index"] for row in result["layers"]]
        assert [(k, c) for _, k, c in cells] == [(row["kind"], row["cache"] or "") for row in result["layers"]]


def test_hover_details_name_kind_window_and_cache(demo):
    first = _sections(demo["html"])[0]
    tip = re.search(r'data-layer="0"[^>]*data-tip="([^"]*)"', first).group(1)
    row = demo["doc"]["results"][0]["layers"][0]
    assert f"kind    {row['kind']}" in tip and f"window  {row['window']}" in tip
    assert f"cache {row['cache']}" in tip and f"{row['kv_heads']} kv x {row['head_dim']}" in tip


def test_findings_carry_catalog_text_and_fixes(demo):
    from html import unescape

    from kvdoctor.catalog import builtin_catalog

    broken = unescape(_sections(demo["html"])[1])
    result = demo["doc"]["results"][1]
    assert "CFG001" in [f["code"] for f in result["findings"]]
    for finding in result["findings"]:
        entry = builtin_catalog()[finding["code"]]
        assert f"<code>{finding['code']}</code>" in broken and finding["message"] in broken
        assert all(f"fix: {fix}" in broken for fix in finding["fixes"])
        assert f"<summary>{entry.summary}</summary>" in broken
        assert " ".join(entry.meaning.split()) in broken


def test_memory_bars_are_the_budget_documents_tokens(demo):
    from kvdoctor.report.budget import tokens_fit

    healthy = _sections(demo["html"])[0]
    for row in demo["budget"]["engines"]:
        assert f">{tokens_fit(row):,} tokens</text>" in healthy
    assert "bytes per token per layer" in healthy


def test_no_budget_gives_bytes_per_token_per_layer_kind(tmp_path):
    model = make_model(tmp_path, "gemma-3-1b-it", checkpoint=False)
    proc = run("check", str(model), "--format", "html", "--json-output", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    per_layer = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2  # K and V, 2 bytes each
    layers = json.loads((tmp_path / "r.json").read_text())["results"][0]["layers"]
    sliding = sum(1 for row in layers if row["kind"] == "sliding_attention")
    assert 0 < sliding < len(layers)
    assert f"sliding_attention x{sliding} ({per_layer:,} B/layer)" in proc.stdout
    assert f">{sliding * per_layer:,} B/token</text>" in proc.stdout


def test_unreadable_target_is_a_section_with_its_error(tmp_path):
    proc = run("check", str(tmp_path / "missing"), "--format", "html")
    assert proc.returncode == 2
    assert "cannot check:" in proc.stdout and "no such model directory" in proc.stdout


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_renders_in_headless_chromium(demo, tmp_path):
    shot = tmp_path / "report.png"
    render = _chromium(tmp_path, demo["page"], "--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={shot}")
    assert render.returncode == 0, render.stderr[-2000:]
    assert _png_size(shot) == (1280, 1600) and shot.stat().st_size > 20_000
    dom = _chromium(tmp_path, demo["page"], "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "CONSOLE" not in render.stderr + dom.stderr  # no script error, no console output at all
    rendered = _sections(dom.stdout)
    for section, result in zip(rendered, demo["doc"]["results"]):
        assert [int(i) for i, _, _ in CELL.findall(section)] == [row["index"] for row in result["layers"]]
    assert 'id="tip"' in dom.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_chromium_reports_a_script_error(tmp_path):
    """The console check above can fail: a page with a broken script is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>no_such_function();</script></body></html>")
    out = _chromium(tmp_path, bad, "--dump-dom")
    assert "CONSOLE" in out.stderr and "no_such_function" in out.stderr


def test_state_layers_are_not_priced_as_key_value_rows(tmp_path):
    model = make_model(tmp_path, "kimi-linear", checkpoint=False)
    proc = run("check", str(model), "--engine", "sglang", "--static", "--format", "html")
    assert proc.returncode == 0, proc.stderr
    memory = proc.stdout[proc.stdout.index("<h3>Memory</h3>"):proc.stdout.index("<h3>Findings</h3>")]
    assert "B/token</text>" not in memory  # Kimi-Linear has KDA (state) and MLA (latent) layers only
    assert "kda, mla layers keep a latent cache or a recurrent state" in memory
    assert "<h3>State caches per slot</h3>" in proc.stdout and "2,957,312 B/slot" in proc.stdout


# Appended to a copy of the page: after layout, the body records the viewport's width and every element
# that reaches past it (unless a scrolling box of its own holds it), for --dump-dom to show.
MEASURE = """<script>
(function () {
  var width = document.documentElement.clientWidth, wide = [];
  function scrolled(el) {
    for (var p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      var o = getComputedStyle(p).overflowX;
      if (o === 'auto' || o === 'scroll' || o === 'hidden') return true;
    }
    return false;
  }
  document.querySelectorAll('body *').forEach(function (el) {
    var r = el.getBoundingClientRect();
    if (r.width && r.right > width + 0.5 && !scrolled(el))
      wide.push(el.tagName.toLowerCase() + '.' + (el.getAttribute('class') || '') + ' to ' + Math.round(r.right));
  });
  document.body.setAttribute('data-viewport', width);
  document.body.setAttribute('data-page', document.documentElement.scrollWidth);
  document.body.setAttribute('data-wide', wide.join('; '));
})();
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_fits_a_700_pixel_window(demo, tmp_path):
    """At 700 px no element of the demo page (budget bars, layer map, tables) is wider than the window."""
    from html import unescape

    page = tmp_path / "measured.html"
    page.write_text(demo["html"].replace("</body>", MEASURE + "</body>"))
    dom = _chromium(tmp_path, page, "--hide-scrollbars", "--window-size=700,1200", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r'<body data-viewport="(\d+)" data-page="(\d+)" data-wide="([^"]*)"', dom.stdout)
    assert body is not None, dom.stdout[:2000]
    viewport, page_width, wide = int(body.group(1)), int(body.group(2)), unescape(body.group(3))
    assert 600 < viewport <= 700
    assert wide == "" and page_width <= viewport, wide


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_the_700_pixel_check_sees_a_wide_element(tmp_path):
    """The measure above can fail: a 900 px box is reported."""
    page = tmp_path / "wide.html"
    page.write_text('<!DOCTYPE html><html><body><div class="box" style="width:900px">x</div>' + MEASURE + "</body></html>")
    dom = _chromium(tmp_path, page, "--hide-scrollbars", "--window-size=700,1200", "--dump-dom")
    assert 'data-wide="div.box to 9' in dom.stdout, dom.stdout[:2000]


def test_the_page_has_an_index_of_its_models(demo):
    """One row per model, linked to its section's anchor, with its errors, warnings and top code."""
    html = demo["html"]
    index = html[html.index('<nav class="index"'):html.index("</nav>")]
    links = re.findall(r'<a href="#([^"]+)">([^<]+)</a>', index)
    assert [target for _, target in links] == [r["target"] for r in demo["doc"]["results"]]
    for (anchor, _), result in zip(links, demo["doc"]["results"]):
        assert html.count(f' id="{anchor}"') == 1
        section = html[html.index(f' id="{anchor}"'):]
        assert section.startswith(f' id="{anchor}" data-target="{result["target"]}"')
    rows = re.findall(r"<tr><td><a [^>]+>[^<]+</a></td><td>([^<]*)</td><td class=n>(\d+)</td><td class=n>(\d+)</td>"
                      r"<td>([^<]*)</td>", index)
    errors = [sum(f["severity"] == "error" for f in r["findings"]) for r in demo["doc"]["results"]]
    assert [int(e) for _, e, _, _ in rows] == errors and errors[1] > 0
    assert rows[1][3] == "CFG001" and rows[0][0] == "sglang-mlx"
