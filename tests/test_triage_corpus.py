"""Triage over the real-log corpus (tests/data/logs, listed in SOURCES.md): each log names exactly its
expected entry, and a log whose error the catalog does not know names none and says where it looked:
`none` for a log about something else, `gap` for a runtime KV error the catalog has no entry for yet
(a miss in the score tools/triage_eval.py prints, but never a wrong entry); a generic GPU error that
no entry claims is reported as unattributed instead of unknown. `miss(CODE)` is a log whose
fitting entry is CODE but whose excerpt lacks the text to name it by (a traceback cut before its message):
triage names CODE or nothing, never another entry."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.triage import triage_file

LOGS = Path(__file__).resolve().parent / "data" / "logs"
ROW = re.compile(r"^\| (\S+\.log) \| ([\w.-]+/[\w.-]+#\d+) \| ([^|]+) \| (\S+) \|$")
MISS = re.compile(r"^miss\(([A-Z]{2,5}\d{3})\)$")
ROWS = [m.groups() for line in (LOGS / "SOURCES.md").read_text().splitlines() if (m := ROW.match(line))]


def test_every_log_is_listed_once_and_the_corpus_is_large_enough():
    listed = [row[0] for row in ROWS]
    assert sorted(listed) == sorted(p.name for p in LOGS.glob("*.log"))
    assert len(set(listed)) == len(listed)
    assert len(ROWS) >= 40
    assert sum(row[3] == "none" for row in ROWS) >= 4  # logs triage must not claim


@pytest.mark.parametrize("name, thread, version, expected", ROWS, ids=[r[0] for r in ROWS])
def test_triage_names_the_expected_entry(name, thread, version, expected):
    report = triage_file(str(LOGS / name), builtin_catalog())
    codes = [hit.entry.code for hit in report.hits]
    if MISS.match(expected):
        fitting = MISS.match(expected).group(1)
        assert builtin_catalog().get(fitting) is not None, f"{fitting} is not in the catalog"
        assert codes in ([], [fitting])
    elif expected in ("none", "gap"):
        # nothing named: "unknown" with the line looked at, or a generic GPU error left unattributed
        assert codes == [] and ((report.unknown is not None and report.unknown["text"]) or report.unattributed)
    else:
        assert builtin_catalog().get(expected) is not None, f"{expected} is not in the catalog"
        assert codes == [expected]
        assert report.unknown is None
