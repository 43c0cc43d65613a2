"""`kvdoctor merge PART.json ...`: join the JSON reports of `check --shard K/N` runs into one result.

Each part is the JSON document `check --format json` writes (or `--json-output`). The results are
read back into kvdoctor's own model and ordered by target, so every output format renders the
merged run as it renders one unsharded run sorted by target, and the exit code follows the same rule
(2 if a target could not be checked, else 1 for a finding at or above --fail-on).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kvdoctor.errors import InputError
from kvdoctor.load.jsonfile import load_json, show
from kvdoctor.model import Finding, Result, SEVERITIES

MAX_PARTS = 10_000
FINDING_FIELDS = ("code", "message", "layer", "file", "line", "key", "engine_error", "evidence", "severity",
                  "name", "fixes")


def _finding(raw: Any, where: str) -> Finding:
    if not isinstance(raw, dict) or not isinstance(raw.get("code"), str) or raw.get("severity") not in SEVERITIES:
        raise InputError(f"{where}: expected a finding with a 'code' and a 'severity' of {', '.join(SEVERITIES)}")
    return Finding(**{k: raw[k] for k in FINDING_FIELDS if k in raw})


def read_part(path: Path) -> tuple[list[Result], list[list[str]], str | None]:
    """(results, checked codes per result, deploy file) of one part. InputError when it is not a report."""
    doc, _ = load_json(path, "kvdoctor JSON report", with_lines=False)
    if not isinstance(doc, dict) or doc.get("tool", {}).get("name") != "kvdoctor" \
            or not isinstance(doc.get("results"), list):
        raise InputError(f"{path}: not a kvdoctor JSON report (expected the output of `check --format json`)")
    results, checked = [], []
    for i, raw in enumerate(doc["results"]):
        where = f"{path}: results[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("target"), str) or not isinstance(raw.get("findings"), list):
            raise InputError(f"{where}: expected an object with 'target' and 'findings'")
        result = Result(target=raw["target"], model_type=raw.get("model_type"), engine=raw.get("engine", ""),
                        engine_versions=raw.get("engine_versions") or {}, layers=raw.get("layers") or [],
                        findings=[_finding(f, f"{where}.findings[{j}]") for j, f in enumerate(raw["findings"])],
                        error=raw.get("error"), info=raw.get("info") or {})
        if "model_dir" in raw:
            result.model_dir = Path(raw["model_dir"])
        if isinstance(raw.get("source"), dict):
            result.source = raw["source"]
        results.append(result)
        checked.append(list(raw.get("checked") or []))
    deploy = doc.get("deploy")
    return results, checked, deploy if isinstance(deploy, str) else None


def merge_parts(paths: list[str]) -> tuple[list[Result], list[list[str]], str | None]:
    """All parts' results sorted by target; a target in two parts is an input error (overlapping shards)."""
    if len(paths) > MAX_PARTS:
        raise InputError(f"{len(paths)} parts, more than the {MAX_PARTS} accepted")
    rows: list[tuple[str, int, Result, list[str]]] = []
    deploys = set()
    seen: dict[str, str] = {}
    for n, name in enumerate(paths):
        results, checked, deploy = read_part(Path(name))
        if deploy:
            deploys.add(deploy)
        for result, codes in zip(results, checked):
            if result.target in seen:
                raise InputError(f"{name}: target {show(result.target)} is also in {seen[result.target]}; "
                                 "expected each target in one shard")
            seen[result.target] = name
            rows.append((result.target, n, result, codes))
    if len(deploys) > 1:
        raise InputError(f"the parts were checked with different deploy files: {', '.join(sorted(deploys))}")
    rows.sort(key=lambda row: row[0])
    return [r[2] for r in rows], [r[3] for r in rows], deploys.pop() if deploys else None
