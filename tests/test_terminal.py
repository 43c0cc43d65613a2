"""What a user sees on an 80-column terminal: finding lines indented under their text, the compact
`budget` table and its bar chart, and the progress display (only on a terminal, never with --quiet
or a machine format)."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from kvdoctor.engines.pins import PINS

from helpers import REAL, ROOT, SHORT, make_model, run

HEAD = re.compile(r"^[A-Z]{2,5}[0-9]{3} (error|warning|info) ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _panel_lines(text: str) -> list[str]:
    """The content of the report panels: the border and one space of padding removed."""
    return [line[2:-2].rstrip() for line in text.splitlines() if line.startswith("│ ") and line.endswith(" │")]


def test_wrapped_finding_lines_stay_under_their_text_at_80_columns(tmp_path):
    model = make_model(tmp_path, "gemma-2-2b", checkpoint=False)
    proc = run("check", str(model), "--engine", "sglang-mlx", "--static", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    lines = _panel_lines(proc.stdout)
    heads = [i for i, line in enumerate(lines) if HEAD.match(line)]
    assert len(heads) >= 2
    body = [line for i, line in enumerate(lines) if i > heads[0] and i not in heads and line]
    assert len(body) > 2 * len(heads)  # long messages and fixes did wrap
    assert all(line.startswith("  ") for line in body), [line for line in body if not line.startswith("  ")]
    # a wrapped fix continues under the fix's text, after "fix: "
    fix_lines = [i for i, line in enumerate(lines) if line.startswith("  fix: ")]
    continued = [lines[i + 1] for i in fix_lines if i + 1 < len(lines) and lines[i + 1].startswith("       ")]
    assert continued


def _budget(*args: str) -> subprocess.CompletedProcess:
    proc = run("budget", str(REAL / SHORT["qwen3-next"]), "--kv-budget", "40GiB", "--mode", "all", *args,
               env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    return proc


def test_budget_is_one_compact_table_and_a_bar_chart_at_80_columns():
    from kvdoctor.report.budget import mode_labels, tokens_fit

    out = _budget().stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    doc = json.loads(_budget("--format", "json").stdout)
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["engine", "mode"])
    chart = lines.index("tokens that fit")
    labels = mode_labels(doc["engines"])
    assert len(set(zip((r["engine"] for r in doc["engines"]), labels))) == len(labels)  # every mode told apart
    for row, mode in zip(doc["engines"], labels):
        fit = tokens_fit(row)
        label = f"{row['engine']} {mode}"
        bars = [line for line in lines[chart + 1:] if line.startswith(label[:30])]
        assert bars, label
        if fit is not None:
            assert any(line.endswith(f"{fit:,}") and "█" in line for line in bars)
            assert any(f"{fit:,}" in line for line in lines[header:chart])
    largest = max(f for f in map(tokens_fit, doc["engines"]) if f is not None)
    top = next(line for line in lines[chart + 1:] if line.endswith(f"{largest:,}"))
    assert top.count("█") >= 20  # the largest bar takes the chart's width
    assert f"vllm {PINS['vllm']}: KV budget" not in out  # the per-engine detail tables only with --verbose


def test_budget_verbose_adds_the_detail_tables():
    out = _budget("--verbose").stdout
    for title in (f"vllm {PINS['vllm']}: KV budget 40.00 GiB", "sglang 0.5.23: KV budget 40.00 GiB",
                  "mlx-lm 0.32.2: KV budget 40.00 GiB", "capacity unit:", "groups / pools", "largest context"):
        assert title in out
    assert max(len(line) for line in out.splitlines()) <= 80


def _in_terminal(args: list[str], env: dict | None = None) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal of 80 columns; everything it drew."""
    master, slave = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 80, 0, 0))
    full_env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", **(env or {})}
    full_env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "kvdoctor", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=full_env, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def probed_model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("progress"), "gpt-oss-20b")


def test_progress_shows_on_a_terminal(probed_model):
    drawn = ANSI.sub("", _in_terminal(["check", str(probed_model), "--engine", "sglang-mlx"]))
    assert "reading config and checkpoint headers" in drawn
    assert "mask_routing probe" in drawn  # the probe stage was shown while it ran


@pytest.mark.parametrize("extra", [["--quiet"], ["--format", "json"], ["--format", "concise"]])
def test_no_progress_with_quiet_or_a_machine_format(probed_model, extra):
    drawn = ANSI.sub("", _in_terminal(["check", str(probed_model), "--engine", "sglang-mlx", *extra]))
    assert "rules (probes)" not in drawn and "reading config" not in drawn
    assert "1 model(s): 0 with errors" in drawn or '"summary"' in drawn  # the report itself was printed


def test_no_progress_when_not_a_terminal(probed_model):
    proc = run("check", str(probed_model), "--engine", "sglang-mlx")
    assert "reading config" not in proc.stderr and "rules (probes)" not in proc.stderr


def test_an_engine_error_worded_as_the_finding_is_not_printed_twice(tmp_path):
    """The vLLM refusal of the demo: the finding quotes vLLM's message, so its engine-error line names the
    class and points at the message instead of repeating 8 lines; a message in kvdoctor's own words
    keeps the engine's text beside it (the HTML report does the same)."""
    from rich.console import Console

    from kvdoctor.model import Finding
    from kvdoctor.report.rich_report import finding_block

    model = ROOT / "fixtures" / "models" / "openai__gpt-oss-20b"
    proc = run("check", str(model), "--engine", "vllm", "--deploy", str(ROOT / "fixtures/demo/vllm-too-long.yaml"),
               "--select", "VLM002", "--html-output", str(tmp_path / "report.html"))
    text = " ".join(proc.stdout.replace("│", " ").split())
    page = (tmp_path / "report.html").read_text()
    assert page.count("User-specified max_model_len (262144)") == 1 and "ValidationError: the message above" in page
    assert proc.returncode == 1 and text.count("User-specified max_model_len (262144)") == 1
    assert "engine would raise at startup: ValidationError: the message above" in text

    def shown(message: str) -> str:
        finding = Finding(code="VLM002", message=message, name="n", severity="error",
                          engine_error={"class": "ValidationError", "message": "vLLM's words", "stage": "startup"})
        console = Console(width=200, record=True)
        console.print(finding_block(finding))
        return console.export_text()

    assert "ValidationError: vLLM's words" in shown("kvdoctor's words")
    assert "the message above" in shown("vLLM's words") and shown("vLLM's words").count("vLLM's words") == 1


# Cache labels that one letter stands for: the same cache under each engine's own name.
SYNONYMS = ({"full", "contiguous"}, {"windowed", "swa"}, {"state", "mamba"})


@pytest.mark.parametrize("engine", ["vllm", "sglang", "sglang-mlx"])
def test_every_cache_an_engine_plans_has_its_own_cell(engine, tmp_path):
    """The engine row of the layer strip shows "?" (and the HTML map red) only for a cache the plan does
    not know, never for a pool or cache class it named: every label the real configs get is in both
    tables, and a letter stands for two labels only where they name the same cache."""
    import shutil

    from kvdoctor.engines import profile
    from kvdoctor.errors import InputError
    from kvdoctor.load.loader import load_model
    from kvdoctor.report.html import CACHE_COLOUR
    from kvdoctor.report.rich_report import CACHE_STYLE

    labels = set()
    for config in sorted((ROOT / "fixtures" / "configs" / "real").glob("*.json")):
        folder = tmp_path / config.stem
        folder.mkdir()
        shutil.copyfile(config, folder / "config.json")
        spec = load_model(str(folder), with_checkpoint=False, library_check=False)
        try:
            plan = profile(engine).plan(spec, profile(engine).Settings())
        except InputError:  # a config this engine's plan cannot read has no cells
            continue
        labels |= {layer.cache or "none" for layer in plan.layers}
    known = labels - {"unknown"}
    assert len(known) > 2 and not known - set(CACHE_STYLE) and not known - set(CACHE_COLOUR)
    by_letter: dict[str, set[str]] = {}
    for label, (letter, _) in CACHE_STYLE.items():
        by_letter.setdefault(letter, set()).add(label)
    assert all(len(group) == 1 or group in SYNONYMS for group in by_letter.values()), by_letter
