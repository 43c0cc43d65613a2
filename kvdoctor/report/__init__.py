"""Renderers share one findings model (kvdoctor.model.Result); adding a format touches one file."""
from __future__ import annotations

from typing import Any

from kvdoctor import __version__
from kvdoctor.model import SEVERITIES, Finding, Result


def finding_json(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code, "name": f.name, "severity": f.severity, "message": f.message, "layer": f.layer,
        "file": f.file, "line": f.line, "engine_error": f.engine_error, "evidence": f.evidence,
        "fixes": f.fixes,
    }


def result_json(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        "target": r.target, "model_type": r.model_type, "engine": r.engine,
        "engine_versions": r.engine_versions, "layers": r.layers,
        "findings": [finding_json(f) for f in r.findings],
    }
    if r.error is not None:
        out["error"] = r.error
    if r.info:
        out["info"] = r.info
    return out


def summary(results: list[Result]) -> dict[str, int]:
    counts = {"targets": len(results), "errors": 0, "warnings": 0, "info": 0,
              "input_errors": sum(1 for r in results if r.error)}
    plural = {"error": "errors", "warning": "warnings", "info": "info"}
    for r in results:
        for f in r.findings:
            counts[plural[f.severity]] += 1
    return counts


def document(results: list[Result]) -> dict[str, Any]:
    return {"tool": {"name": "kvdoctor", "version": __version__},
            "results": [result_json(r) for r in results], "summary": summary(results)}


def exit_code(results: list[Result], fail_on: str, exit_zero: bool = False) -> int:
    """2 if any target could not be read (never hidden); else 1 if a finding is at or above fail_on."""
    if any(r.error for r in results):
        return 2
    if exit_zero:
        return 0
    threshold = SEVERITIES.index(fail_on)
    worst = [SEVERITIES.index(f.severity) for r in results for f in r.findings]
    return 1 if worst and min(worst) <= threshold else 0
