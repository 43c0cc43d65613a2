"""`--format github`: GitHub Actions workflow commands, one annotation per finding, then a summary.

An annotation does not fail the job (the exit code does), and GitHub shows only a limited number per
step, hence the plain summary line at the end.
"""
from __future__ import annotations

from kvdoctor.report import Report, summary_line

LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, message: str, title: str, path: str | None = None, line: int | None = None) -> str:
    props = []
    if path:
        props.append(f"file={_property(path)}")
        if line:
            props.append(f"line={line}")
    props.append(f"title={_property(title)}")
    return f"::{level} {','.join(props)}::{_data(message)}"


def render(report: Report) -> str:
    lines = []
    for result in report.results:
        if result.error:
            path, _ = report.location(result)
            lines.append(annotation("error", f"{result.target}: {result.error}", "kvdoctor: cannot check", path))
            continue
        for finding in result.findings:
            path, line = report.location(result, finding)
            body = "\n".join([finding.message, *(f"fix: {fix}" for fix in finding.fixes)])
            lines.append(annotation(LEVEL[finding.severity], body, f"{finding.code} {finding.name}", path, line))
    lines.append(f"kvdoctor: {summary_line(report)}")
    return "\n".join(lines)
