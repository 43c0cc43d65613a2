"""The terminal report reads well: each message once, a fleet's notes once with their targets, a
summary table (one row per model) and a closing line that counts models as well as findings."""
from __future__ import annotations

import json
import re

import pytest

from helpers import make_model, run

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _short(cfg: dict) -> None:
    cfg["layer_types"] = cfg["layer_types"][:-1]  # CFG001: one entry short


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three config-only models (each gets the CKPT008 note), one of them broken, and a missing path."""
    tmp = tmp_path_factory.mktemp("fleet")
    names = [make_model(tmp, "gemma-2-2b", checkpoint=False, dirname="a-gemma"),
             make_model(tmp, "gpt-oss-20b", checkpoint=False, edit=_short, dirname="b-broken"),
             make_model(tmp, "mistral-7b", checkpoint=False, dirname="c-mistral")]
    return tmp, [str(p) for p in names] + [str(tmp / "d-missing")]


@pytest.mark.parametrize("fmt", ["rich", "json"])
def test_a_missing_path_says_so_once(tmp_path, fmt):
    """One line on stderr, in every format; the terminal report does not repeat it."""
    missing = str(tmp_path / "nowhere")
    proc = run("check", missing, "--format", fmt)
    assert proc.returncode == 2
    assert proc.stderr == f"kvdoctor: error: {missing}: no such model directory\n"
    if fmt == "rich":
        assert "no such model directory" not in proc.stdout and proc.stdout.count(missing) == 0, proc.stdout
        assert "1 could not be checked" in proc.stdout.splitlines()[-1]
    else:  # the document carries it as data
        assert json.loads(proc.stdout)["results"][0]["error"] == f"{missing}: no such model directory"


@pytest.mark.parametrize("jobs", ["1", "2"])  # panels rendered here, and by the workers
def test_a_fleet_ends_with_its_notes_a_table_and_the_models_counted(fleet, jobs):
    root, targets = fleet
    proc = run("check", *targets, "--jobs", jobs, env={"COLUMNS": "200"})
    out = ANSI.sub("", proc.stdout)
    assert proc.returncode == 2, proc.stderr
    assert out.count("no safetensors checkpoint in the model directory") == 1, out  # the note's text, once
    note = out.index("CKPT008 info [no-checkpoint]\n")
    assert "for all 3 models" in out[note:].splitlines()[1]
    assert out.count("CKPT008 info [no-checkpoint] (in the notes below the panels)") == 3
    assert "CFG001" in out[:note] and "layer_types lists 23 layers" in out[:note]  # an error stays in its panel
    lines = out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.strip() == "Summary"):]
    rows = {line.split()[0]: line.split()[1:] for line in table if line.strip().startswith(str(root))}
    assert rows == {targets[0]: ["hf", "0", "0", "CKPT008"], targets[1]: ["hf", "1", "0", "CFG001"],
                    targets[2]: ["hf", "0", "0", "CKPT008"], targets[3]: ["hf", "-", "-", "cannot", "check"]}
    assert out.splitlines()[-1] == ("4 model(s): 1 with errors, 0 with warnings, 2 clean, 1 could not be checked; "
                                    "findings: 1 error(s), 0 warning(s), 3 info")


def test_the_json_summary_counts_the_models_as_the_closing_line_does(fleet):
    _, targets = fleet
    doc = json.loads(run("check", *targets, "--format", "json").stdout)
    assert doc["summary"]["models"] == {"error": 1, "warning": 0, "clean": 2}
    assert (doc["summary"]["targets"], doc["summary"]["input_errors"]) == (4, 1)


def test_one_target_keeps_its_note_in_its_panel(fleet):
    _, targets = fleet
    out = ANSI.sub("", run("check", targets[0]).stdout)
    assert "no safetensors checkpoint in the model directory" in out and "Summary" not in out
    assert "notes below" not in out
    assert out.splitlines()[-1] == ("1 model(s): 0 with errors, 0 with warnings, 1 clean; "
                                    "findings: 0 error(s), 0 warning(s), 1 info")


def test_a_note_names_its_models_and_layers_unless_it_is_everyones():
    import io

    from rich.console import Console

    from kvdoctor.model import Finding, Result
    from kvdoctor.report.rich_report import notes

    def result(target: str, *layers: int | None) -> Result:
        return Result(target=target, model_type="x", engine="hf", engine_versions={}, layers=[],
                      findings=[Finding("CFG010", "a note", layer=layer, severity="info", name="n") for layer in layers])

    def shown(*results: Result) -> str:
        console = Console(file=io.StringIO(), width=200, color_system=None)
        console.print(notes(list(results)))
        return console.file.getvalue()

    assert "for all 2 models" in shown(result("a", None), result("b", None))
    assert "for 1 model(s): a (layer 1, 3)" in shown(result("a", 1, 3), result("b"))
    assert "for 2 model(s): a (layer 0-2), b" in shown(result("a", 0, 1, 2), result("b", None))


def test_notes_are_printed_as_written_brackets_included():
    """rich reads `[mlx]` as markup and drops it; a note is text."""
    from rich.console import Console

    from kvdoctor.model import Result
    from kvdoctor.report.rich_report import model_summary

    notes = {"engine_notes": ["pip install 'kvdoctor[mlx]' for the probes"], "notes": ["[sliding_attention] x3"],
             "defaults": {"layer_types": ["full_attention"]}}
    result = Result(target="t", model_type="llama", engine="hf", engine_versions={}, layers=[], findings=[],
                    info=notes)
    console = Console(record=True, width=200)
    console.print(model_summary(result))
    text = console.export_text()
    assert "'kvdoctor[mlx]'" in text and "[sliding_attention] x3" in text and "['full_attention']" in text


def test_the_html_of_a_fleet_writes_each_note_once_after_the_models(fleet, tmp_path):
    _, targets = fleet
    page = tmp_path / "fleet.html"
    run("check", *targets, "--html-output", str(page))
    html = page.read_text()
    assert html.count("no safetensors checkpoint in the model directory") == 1
    notes = html.index('id="notes"')
    assert html.count('<a href="#notes">') == 3 and html.rindex('<a href="#notes">') < notes
    assert "for all 3 models" in html[notes:] and "CFG001" in html[:notes]  # the error stays with its model
