"""`kvdoctor rules` (rich at 80 columns, json with version ranges, markdown) and `explain` (reflowed
prose, verbatim examples)."""
from __future__ import annotations

import json

from helpers import run
from kvdoctor.catalog import builtin_catalog
from kvdoctor.report.explain import reflow

CATALOG = builtin_catalog()


def test_rules_json_lists_every_entry_with_its_version_ranges():
    proc = run("rules", "--format", "json")
    entries = json.loads(proc.stdout)
    assert proc.returncode == 0 and len(entries) == len(CATALOG.codes())
    for item in entries:
        assert item["engines"] and all(e["name"] and e["versions"] for e in item["engines"]), item["code"]
        assert item["engines"] == [e.model_dump() for e in CATALOG[item["code"]].engines]


def test_rules_reads_at_80_columns_with_the_summary_on_its_own_line():
    proc = run("rules", env={"COLUMNS": "80"})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and max(len(line) for line in lines) <= 80
    i = next(n for n, line in enumerate(lines) if line.startswith("SWA001 "))
    assert lines[i].split() == ["SWA001", "error", CATALOG["SWA001"].name]
    assert lines[i + 1].startswith(" " * 9) and CATALOG["SWA001"].summary.startswith(lines[i + 1].strip()[:30])
    verbose = run("rules", "--verbose", env={"COLUMNS": "80"}).stdout
    assert "engines: sglang-mlx ==0.5.23" in verbose and "engines:" not in proc.stdout


def test_rules_markdown_is_a_table_and_a_bad_format_is_exit_2():
    proc = run("rules", "--format", "markdown")
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| code | severity |") and len(rows) == len(CATALOG.codes()) + 1
    bad = run("rules", "--format", "yaml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_reflow_joins_hard_wrapped_lines_and_keeps_paragraphs_and_items():
    text = "one two\nthree four\n\nsecond para\n- item a\n- item b\n"
    assert reflow(text) == ["one two three four", "second para", "- item a", "- item b"]


def test_explain_reflows_the_meaning_and_keeps_examples_verbatim():
    entry = CATALOG["SWA001"]
    out = run("explain", "SWA001", env={"COLUMNS": "200"}).stdout
    first = reflow(entry.meaning)[0]
    assert first[:150] in " ".join(out.split())  # one paragraph, wrapped only by the terminal
    hard_break = entry.meaning.splitlines()[0].split()[-1] + " " + entry.meaning.splitlines()[1].split()[0]
    assert hard_break in out  # the YAML line break is gone
    for line in entry.fixes[0].before.strip().splitlines():
        assert line.strip() in out
    assert "kvdoctor check catches this before deploy: SWA001" in out


def _explained(code: str, width: int) -> list[str]:
    import io

    from rich.console import Console

    from kvdoctor.report.explain import render_entry

    console = Console(file=io.StringIO(), width=width, color_system=None)
    render_entry(CATALOG[code], console)
    return console.file.getvalue().splitlines()


def test_explain_never_cuts_an_example_line_at_80_columns():
    """Every line of every before/after example is printed whole, on a line of its own, at 80 columns
    (those longer than the terminal too: the terminal folds them; a copy gives the line as written)."""
    cut, total, longer = [], 0, 0
    for code in CATALOG.codes():
        lines = {line.rstrip() for line in _explained(code, 80)}
        for fix in CATALOG[code].fixes:
            for example in (fix.before, fix.after):
                for line in (example or "").rstrip().splitlines():
                    total += 1
                    longer += len(line) + 7 > 80
                    if " " * 7 + line.rstrip() not in lines:
                        cut.append(f"{code}: {line}")
    assert longer > 0 and total > 200  # the check sees lines wider than the terminal
    assert cut == []


def test_explain_breaks_prose_only_between_sentences_at_200_columns():
    """At 200 columns each sentence of the prose that fits one line is on one line."""
    from kvdoctor.report.explain import sentences

    broken, seen = [], 0
    for code in CATALOG.codes():
        entry = CATALOG[code]
        lines = _explained(code, 200)
        texts = [*reflow(entry.meaning), *entry.triggers, *entry.prevention, *(f.summary for f in entry.fixes)]
        for text in texts:
            for sentence in sentences(" ".join(text.split())):
                if len(sentence) <= 190:
                    seen += 1
                    if not any(sentence in line for line in lines):
                        broken.append(f"{code}: {sentence}")
    assert seen > 1000 and broken == []


def test_sentences_end_at_a_stop_and_a_capital_not_at_an_abbreviation():
    from kvdoctor.report.explain import sentences

    assert sentences("One (e.g. Two) ends. Then `x` runs. v0.5.23 is pinned; i.e. Three") == \
        ["One (e.g. Two) ends.", "Then `x` runs. v0.5.23 is pinned; i.e. Three"]
