"""`--format json-lines`: one JSON object per line, per finding (or per target that could not be checked).

Each object stands alone: the finding's fields plus its target, engine, location and fingerprint.
"""
from __future__ import annotations

import json

from kvdoctor.report import Report, finding_json


def render(report: Report) -> str:
    lines = []
    for i, result in enumerate(report.results):
        if result.error:
            lines.append(json.dumps({"target": result.target, "engine": result.engine, "error": result.error}))
            continue
        for finding, fp in zip(result.findings, report.fingerprints(i)):
            path, _ = report.location(result, finding)
            obj = {"target": result.target, "engine": result.engine, **finding_json(finding),
                   "path": path, "fingerprint": fp}
            lines.append(json.dumps(obj))
    return "\n".join(lines)
