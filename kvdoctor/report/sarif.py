"""`--format sarif`: SARIF 2.1.0 for GitHub code scanning (`github/codeql-action/upload-sarif`).

GitHub reads the rules' short and full descriptions and help, a stable `ruleId`, the level, a
repository-relative location and `partialFingerprints` (line-free here, so an alert survives edits
to the file). Targets that could not be checked become tool execution notifications.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from kvdoctor import __version__
from kvdoctor.catalog import Description
from kvdoctor.report.jsontext import indented
from kvdoctor.model import Finding, Result
from kvdoctor.report import Report

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}
FINGERPRINT_KEY = "kvdoctorFingerprint/v1"


def _help_markdown(entry: Description) -> str:
    parts = [f"**{entry.summary}**", "", entry.meaning.strip(), "", "**Fixes**", ""]
    for i, fix in enumerate(entry.fixes, 1):
        parts.append(f"{i}. {fix.summary}")
        for label, example in (("before", fix.before), ("after", fix.after)):
            if example:
                parts += ["", f"   {label}:", "", "   ```", *(f"   {ln}" for ln in example.rstrip().splitlines()),
                          "   ```"]
    if entry.error:
        parts += ["", f"Engine error: `{entry.error.class_}: {entry.error.message}`"]
    if entry.references:
        parts += ["", "**References**", "", *(f"- {ref}" for ref in entry.references)]
    return "\n".join(parts)


def _help_text(entry: Description) -> str:
    fixes = "\n".join(f"{i}. {fix.summary}" for i, fix in enumerate(entry.fixes, 1))
    return f"{entry.summary}\n\n{entry.meaning.strip()}\n\nFixes:\n{fixes}"


def rule(entry: Description) -> dict:
    return {
        "id": entry.code,
        "name": entry.name,
        "shortDescription": {"text": entry.summary},
        "fullDescription": {"text": entry.meaning.strip()},
        "help": {"text": _help_text(entry), "markdown": _help_markdown(entry)},
        "defaultConfiguration": {"level": LEVEL[entry.severity]},
        "properties": {"tags": ["kvdoctor", entry.family, *entry.tags]},
    }


def _uri(path: str) -> dict:
    if Path(path).is_absolute():
        return {"uri": Path(path).as_uri()}
    return {"uri": quote(path), "uriBaseId": "%SRCROOT%"}


def _location(path: str, line: int | None) -> dict:
    return {"physicalLocation": {"artifactLocation": _uri(path), "region": {"startLine": line or 1}}}


def _result(report: Report, result: Result, finding: Finding, fp: str, rule_index: dict[str, int]) -> dict:
    path, line = report.location(result, finding)
    properties = {"target": result.target, "model": report.identity(result), "engine": result.engine,
                  "severity": finding.severity, "fixes": finding.fixes}
    if finding.layer is not None:
        properties["layer"] = finding.layer
    if finding.key:
        properties["key"] = finding.key
    out = {
        "ruleId": finding.code,
        "level": LEVEL[finding.severity],
        "message": {"text": f"{finding.message} (model {report.identity(result)}, engine {result.engine})"},
        "locations": [_location(path, line)],
        "partialFingerprints": {FINGERPRINT_KEY: fp},
        "properties": properties,
    }
    if finding.code in rule_index:
        out["ruleIndex"] = rule_index[finding.code]
    return out


def document(report: Report) -> dict:
    codes = {code for checked in report.checked for code in checked}
    codes |= {f.code for r in report.results for f in r.findings}
    entries = [entry for code in sorted(codes) if (entry := report.catalog.description(code)) is not None]
    rule_index = {entry.code: i for i, entry in enumerate(entries)}
    results = [_result(report, r, f, fp, rule_index)
               for i, r in enumerate(report.results) for f, fp in zip(r.findings, report.fingerprints(i))]
    notifications = [{"level": "error", "message": {"text": f"cannot check {r.target}: {r.error}"},
                      "locations": [_location(*report.location(r))]}
                     for r in report.results if r.error]
    root = Path(report.root).resolve().as_uri().rstrip("/") + "/"
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "kvdoctor", "version": __version__, "semanticVersion": __version__,
                                "rules": [rule(entry) for entry in entries]}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root}},
            "invocations": [{"executionSuccessful": not notifications,
                             "toolExecutionNotifications": notifications}],
            "results": results,
        }],
    }


def render(report: Report) -> str:
    return indented(document(report))
