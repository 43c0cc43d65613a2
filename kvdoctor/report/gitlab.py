"""`--format gitlab`: a GitLab Code Quality report (`artifacts:reports:codequality`).

A JSON array of issues: description, check_name, fingerprint (unique per issue, line-free), severity
and location {path, lines: {begin}}.
"""
from __future__ import annotations

from kvdoctor.report.fingerprint import sha256
from kvdoctor.report.jsontext import indented
from kvdoctor.report import Report

SEVERITY = {"error": "major", "warning": "minor", "info": "info"}


def render(report: Report) -> str:
    issues = []
    for i, result in enumerate(report.results):
        if result.error:
            path, _ = report.location(result)
            fp = sha256(f"cannot-check\x1f{report.identity(result)}".encode()).hexdigest()[:24]
            issues.append({"description": f"kvdoctor could not check {result.target}: {result.error}",
                           "check_name": "kvdoctor-cannot-check", "fingerprint": fp, "severity": "blocker",
                           "location": {"path": path, "lines": {"begin": 1}}})
            continue
        for finding, fp in zip(result.findings, report.fingerprints(i)):
            path, line = report.location(result, finding)
            issues.append({"description": f"{finding.code} {finding.message}", "check_name": finding.code,
                           "fingerprint": fp, "severity": SEVERITY[finding.severity],
                           "location": {"path": path, "lines": {"begin": line or 1}}})
    return indented(issues)
