"""Score `kvdoctor triage` on a directory of real logs listed in its SOURCES.md.

    python tools/triage_eval.py tests/data/logs

A row is right when triage names exactly the expected entry, or, for `none`, names nothing and
says "unknown". Prints one line per log and the share that is right.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.triage import triage_file

ROW = re.compile(r"^\| (\S+\.log) \| ([\w.-]+/[\w.-]+#\d+) \| ([^|]+) \| (\S+) \|$")


def main(directory: str) -> int:
    folder = Path(directory)
    rows = [m.groups() for line in (folder / "SOURCES.md").read_text().splitlines() if (m := ROW.match(line))]
    right = 0
    for name, thread, _, expected in rows:
        report = triage_file(str(folder / name), builtin_catalog())
        codes = [h.entry.code for h in report.hits]
        ok = codes == [] and report.unknown is not None if expected == "none" else codes == [expected]
        right += ok
        print(f"{'ok  ' if ok else 'MISS'} {name} ({thread}): expected {expected}, got {codes or 'unknown'}")
    print(f"{right}/{len(rows)} right ({100 * right / max(len(rows), 1):.0f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
