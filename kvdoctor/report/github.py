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


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def job_summary(report: Report, limit: int = 200) -> str:
    """Markdown for `$GITHUB_STEP_SUMMARY`: one row per model, then the findings with their first fix."""
    from kvdoctor.report import summary

    lines = ["## kvdoctor", "", summary_line(report), "", "| model | engine | errors | warnings | info |",
             "|---|---|---:|---:|---:|"]
    for result in report.results:
        if result.error:
            lines.append(f"| `{_cell(report.identity(result))}` | {_cell(result.engine)} | cannot check: "
                         f"{_cell(result.error)} | | |")
            continue
        counts = summary([result])
        lines.append(f"| `{_cell(report.identity(result))}` | {_cell(result.engine)} | {counts['errors']} | "
                     f"{counts['warnings']} | {counts['info']} |")
    findings = [(result, f) for result in report.results for f in result.findings]
    if findings:
        lines += ["", "| code | severity | where | finding | fix |", "|---|---|---|---|---|"]
        for result, f in findings[:limit]:
            path, line = report.location(result, f)
            where = f"{path}:{line}" if line else path
            lines.append(f"| **{f.code}** {_cell(f.name)} | {f.severity} | `{_cell(where)}` | {_cell(f.message)} | "
                         f"{_cell(f.fixes[0]) if f.fixes else ''} |")
        if len(findings) > limit:
            lines.append(f"\n{len(findings) - limit} more finding(s) left out; see the annotations or the SARIF file.")
    return "\n".join(lines) + "\n"
