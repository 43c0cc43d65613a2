"""`--format concise`: one line per finding, `path:line: CODE [severity] message`, then a summary."""
from __future__ import annotations

from kvdoctor.report import Report, summary_line


def render(report: Report) -> str:
    lines = []
    for result in report.results:
        if result.error:
            lines.append(f"cannot check {result.target}: {result.error}")
            continue
        for finding in result.findings:
            path, line = report.location(result, finding)
            where = f"{path}:{line}" if line else path
            layer = "" if finding.layer is None else f" (layer {finding.layer})"
            lines.append(f"{where}: {finding.code} [{finding.severity}] {finding.message}{layer}")
    lines.append(summary_line(report))
    return "\n".join(lines)
