"""Score `kvdoctor triage` on a directory of real logs listed in its SOURCES.md.

    python tools/triage_eval.py tests/data/logs [FIRST-LAST]

FIRST-LAST scores only the logs whose number is in that range (a held-out set: 240-273).

A row is right when triage names exactly the expected entry, or, for `none` (a log about something
else), names nothing and says "unknown" (or leaves a generic GPU error unattributed). A `gap` row is
a runtime error the catalog has no entry for: it counts as a miss among the logs to be named, and so
does `miss(CODE)`, a log whose fitting entry CODE exists but whose excerpt lacks the text to name it
by (right only if triage names CODE). Prints one line per log, the share of logs with an error to
name that are named with the expected entry, and the logs about something else that some entry
claimed (false matches).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.triage import triage_file

ROW = re.compile(r"^\| (\S+\.log) \| ([\w.-]+/[\w.-]+#\d+) \| ([^|]+) \| (\S+) \|$")


def main(directory: str, numbers: str | None = None) -> int:
    folder = Path(directory)
    rows = [m.groups() for line in (folder / "SOURCES.md").read_text().splitlines() if (m := ROW.match(line))]
    if numbers is not None:
        if not re.fullmatch(r"\d+(?:-\d+)?", numbers):
            print(f"triage_eval: error: {numbers!r} is not a range of log numbers (FIRST-LAST)", file=sys.stderr)
            return 2
        first, _, last = numbers.partition("-")
        rows = [row for row in rows if int(first) <= int(row[0][:3]) <= int(last or first)]
    named = to_name = false_matches = others = 0
    for name, thread, _, expected in rows:
        report = triage_file(str(folder / name), builtin_catalog())
        codes = [h.entry.code for h in report.hits]
        if expected == "none":
            others += 1
            ok = codes == [] and (report.unknown is not None or bool(report.unattributed))
            false_matches += bool(codes)
        else:
            to_name += 1
            ok = codes == [expected.removeprefix("miss(").removesuffix(")")]
            named += ok
        print(f"{'ok  ' if ok else 'MISS'} {name} ({thread}): expected {expected}, got {codes or 'unknown'}")
    print(f"named with the expected entry: {named}/{to_name} ({100 * named / max(to_name, 1):.0f}%); "
          f"logs about something else claimed by an entry: {false_matches}/{others}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
