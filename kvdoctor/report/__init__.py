"""Renderers share one findings model (kvdoctor.model.Result); adding a format touches one file.

Each text format is a function `render(report: Report) -> str` in its own module, imported only when chosen.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from kvdoctor import __version__
from kvdoctor.report.jsontext import indented
from kvdoctor.model import SEVERITIES, Finding, Result

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog

TEXT_FORMATS = {
    "concise": "kvdoctor.report.concise:render",
    "json": "kvdoctor.report:render_json",
    "json-lines": "kvdoctor.report.jsonl:render",
    "sarif": "kvdoctor.report.sarif:render",
    "junit": "kvdoctor.report.junit:render",
    "github": "kvdoctor.report.github:render",
    "gitlab": "kvdoctor.report.gitlab:render",
    "html": "kvdoctor.report.html:render",
}
FORMATS = ("rich", *TEXT_FORMATS)


class Report(msgspec.Struct):
    """One run's results and what every format needs to place them: the project root (locations and
    model identities are relative to it), the catalog, the codes each target was checked for."""

    results: list[Result]
    catalog: "Catalog"
    root: Path
    fail_on: str = "error"
    checked: list[list[str]] = msgspec.field(default_factory=list)  # per result, in order
    deploy_path: str | None = None
    baseline: str | None = None  # the baseline file, when one was applied
    suppressed: int = 0  # findings the baseline hid
    # Each result's entry of the JSON document (result_part) and its panel of the terminal report
    # (rich_report.panel_text), rendered by the worker that checked it; None when not rendered, or when
    # the results changed after the check (a baseline).
    json_parts: list[str] | None = None
    rich_parts: list[str] | None = None

    def fingerprints(self, index: int) -> list[str]:
        """A unique, line-free fingerprint for each finding of results[index]."""
        from kvdoctor.report.fingerprint import unique_fingerprints

        return unique_fingerprints(self.results[index], self.root)

    def identity(self, result: Result) -> str:
        from kvdoctor.report.fingerprint import model_identity

        return model_identity(result.target, self.root)

    def relative(self, path: Path) -> str:
        """A path as the repository sees it: relative to the project root, posix; absolute when outside."""
        from kvdoctor.report.fingerprint import project_path

        return project_path(path, self.root)

    def location(self, result: Result, finding: Finding | None = None) -> tuple[str, int | None]:
        """(file, line) a finding points at: the deploy file for a deploy setting, else a file in the
        model folder (config.json when the finding names none)."""
        model_dir = result.model_dir if result.model_dir is not None else Path(result.target)
        if finding is None or not finding.file:
            return self.relative(model_dir / "config.json"), None
        if self.deploy_path and finding.file == self.deploy_path:
            return self.relative(Path(finding.file)), finding.line
        return self.relative(model_dir / finding.file), finding.line

    def checked_codes(self, index: int) -> list[str]:
        return self.checked[index] if index < len(self.checked) else []


def render(report: Report, fmt: str) -> str:
    """The report in a text format (everything but rich)."""
    module, _, function = TEXT_FORMATS[fmt].partition(":")
    return getattr(importlib.import_module(module), function)(report)


def summary_line(report: Report) -> str:
    line = closing_line(report.results)
    if report.baseline is not None:
        line += f"; {report.suppressed} finding(s) suppressed by baseline {report.baseline}"
    return line


def closing_line(results: list[Result]) -> str:
    """The models by their worst finding, then the findings: what a report ends with."""
    models, counts = model_counts(results), summary(results)
    line = (f"{counts['targets']} model(s): {models['error']} with errors, {models['warning']} with warnings, "
            f"{models['clean']} clean")
    if counts["input_errors"]:
        line += f", {counts['input_errors']} could not be checked"
    return line + (f"; findings: {counts['errors']} error(s), {counts['warnings']} warning(s), "
                   f"{counts['info']} info")


def worst(result: Result) -> str | None:
    """The most severe finding's severity; None for a target without findings or not checked."""
    return min((f.severity for f in result.findings if f.severity), key=SEVERITIES.index, default=None)


def model_counts(results: list[Result]) -> dict[str, int]:
    """Checked models by their worst finding: "error", "warning", or "clean" (nothing above info)."""
    counts = {"error": 0, "warning": 0, "clean": 0}
    for r in results:
        if not r.error:
            counts[worst(r) if worst(r) in ("error", "warning") else "clean"] += 1
    return counts


def top_code(result: Result) -> str | None:
    """The code a reader looks at first: the most frequent among the most severe findings (first seen
    on a tie); None without findings."""
    level = worst(result)
    codes = [f.code for f in result.findings if f.severity == level]
    return max(dict.fromkeys(codes), key=codes.count) if codes else None


def shared_notes(results: list[Result]) -> list[tuple[Finding, dict[str, list[int]]]]:
    """A fleet's notes (info findings), each distinct one once, with the targets (and the layers) it was
    given for: the reports write each note's text once, after the models."""
    groups: dict[tuple, tuple[Finding, dict[str, list[int]]]] = {}
    for r in results:
        for f in r.findings:
            if f.severity == "info":
                key = (f.code, f.name, f.message, tuple(f.fixes), repr(f.engine_error))
                layers = groups.setdefault(key, (f, {}))[1].setdefault(r.target, [])
                if f.layer is not None:
                    layers.append(f.layer)
    return list(groups.values())


def span(indices: list[int]) -> str:
    """Layer indices as short ranges: [0, 1, 2, 4] -> '0-2, 4'."""
    parts, start = [], None
    for i, index in enumerate(indices):
        start = index if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            parts.append(str(start) if start == index else f"{start}-{index}")
            start = None
    return ", ".join(parts)


def for_whom(targets: dict[str, list[int]], checked: set[str]) -> str:
    """The targets (and layers) a shared note was given for, or "all N models"."""
    if set(targets) == checked and not any(targets.values()):
        return f"all {len(checked)} models"
    return f"{len(targets)} model(s): " + ", ".join(target + (f" (layer {span(layers)})" if layers else "")
                                                    for target, layers in targets.items())


def fleet_rows(results: list[Result]) -> list[dict[str, Any]]:
    """One row per model for a fleet's summary table: target, engine, errors, warnings, top code (None
    counts for a target that could not be checked)."""
    rows = []
    for r in results:
        checked = r.error is None
        rows.append({"target": r.target, "engine": r.engine,
                     "errors": sum(f.severity == "error" for f in r.findings) if checked else None,
                     "warnings": sum(f.severity == "warning" for f in r.findings) if checked else None,
                     "top_code": top_code(r), "error": r.error})
    return rows


def finding_json(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code, "name": f.name, "severity": f.severity, "message": f.message, "layer": f.layer,
        "file": f.file, "line": f.line, "key": f.key, "engine_error": f.engine_error, "evidence": f.evidence,
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
    if r.model_dir is not None and str(r.model_dir) != r.target:  # a Hugging Face id: the local snapshot
        out["model_dir"] = str(r.model_dir)
    if r.source is not None:
        out["source"] = r.source
    return out


def summary(results: list[Result]) -> dict[str, int]:
    counts = {"targets": len(results), "errors": 0, "warnings": 0, "info": 0,
              "input_errors": sum(1 for r in results if r.error)}
    plural = {"error": "errors", "warning": "warnings", "info": "info"}
    for r in results:
        for f in r.findings:
            counts[plural[f.severity]] += 1
    return counts


def result_entry(r: Result, root: Path, checked: list[str]) -> dict[str, Any]:
    """A result as the report's JSON document lists it: findings with their fingerprints, the codes checked."""
    from kvdoctor.report.fingerprint import unique_fingerprints

    out = result_json(r)
    for finding, fp in zip(out["findings"], unique_fingerprints(r, root)):
        finding["fingerprint"] = fp
    out["checked"] = checked
    return out


def document(results: list[Result], report: Report | None = None) -> dict[str, Any]:
    """The JSON contract. With a report, each finding carries its fingerprint and the summary the
    number of findings a baseline suppressed."""
    if report is None:
        return _document(results, [result_json(r) for r in results], None)
    return _document(results, [result_entry(r, report.root, report.checked_codes(i)) for i, r in enumerate(results)],
                     report)


def _document(results: list[Result], entries: list[Any], report: Report | None) -> dict[str, Any]:
    doc = {"tool": {"name": "kvdoctor", "version": __version__}, "results": entries,
           "summary": {**summary(results), "models": model_counts(results)}}
    if report is not None:
        if report.baseline is not None:
            doc["summary"]["suppressed"] = report.suppressed
        if report.deploy_path is not None:
            doc["deploy"] = report.deploy_path
    return doc


PART_INDENT = "\n    "  # an entry of "results" sits two levels deep in the document, two spaces a level


def result_part(root: Path, result: Result, checked: list[str]) -> str:
    """A result's entry, as render_json writes it inside the document: a -j worker renders its own
    results, so the parent only joins them."""
    return indented(result_entry(result, root, checked)).replace("\n", PART_INDENT)


def render_json(report: Report) -> str:
    if report.json_parts is None:
        return indented(document(report.results, report))
    # The same document around an empty list; "results" is its first list, after the fixed "tool".
    frame = indented(_document(report.results, [], report))
    if not report.json_parts:
        return frame
    before, _, after = frame.partition('"results": []')
    entries = [piece for part in report.json_parts for piece in (",", PART_INDENT, part)][1:]  # no comma first
    # One join: each copy of a fleet's megabyte-long report is a fresh allocation, faulted in page by page.
    return "".join([before, '"results": [', *entries, "\n  ]", after])


def exit_code(results: list[Result], fail_on: str, exit_zero: bool = False) -> int:
    """2 if any target could not be read (never hidden); else 1 if a finding is at or above fail_on."""
    if any(r.error for r in results):
        return 2
    if exit_zero:
        return 0
    threshold = SEVERITIES.index(fail_on)
    worst = [SEVERITIES.index(f.severity) for r in results for f in r.findings]
    return 1 if worst and min(worst) <= threshold else 0
