"""`--statistics`: how many findings of each code, most frequent first (ruff's layout)."""
from __future__ import annotations

from collections import Counter

from kvdoctor.report.jsontext import indented
from kvdoctor.model import Result


def rows(results: list[Result]) -> list[dict]:
    counts: Counter[str] = Counter(f.code for r in results for f in r.findings)
    first = {}
    for r in results:
        for f in r.findings:
            first.setdefault(f.code, f)
    return [{"code": code, "name": first[code].name, "severity": first[code].severity, "count": count}
            for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def render_text(results: list[Result]) -> str:
    table = rows(results)
    if not table:
        return "no findings"
    width = max(len(str(row["count"])) for row in table)
    code_width = max(len(row["code"]) for row in table)
    return "\n".join(f"{row['count']:>{width}}  {row['code']:<{code_width}}  [{row['severity']}] {row['name']}"
                     for row in table)


def render_json(results: list[Result]) -> str:
    return indented(rows(results))
