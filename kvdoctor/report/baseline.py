"""Fingerprints and baselines: accept today's findings, report only new ones tomorrow.

A fingerprint is the finding's code + the model's identity (its path relative to the project root, or
its Hugging Face id) + the engine + the layer group + the offending key. It holds no line number and
no hash of a file, so editing config.json (or fixing one finding) leaves the other fingerprints alone.

The layer group is the kind of the layer a finding names (`sliding_attention`), or `model` for a
finding about the whole model. It is deliberately not the layer index: rules often name the first
offending layer, which moves when some layers are fixed, and not the set of layers of that kind,
which moves whenever `layer_types` is edited. Several findings may share a fingerprint (one rule,
several layers of one kind), so a baseline records a count per fingerprint, plus the layers it saw,
which decide which of today's findings are the known ones.

A baseline file has two sections: `findings`, rewritten by `--write-baseline`, and `manual`, kept
as it is on every rewrite, for fingerprints accepted for good (each with a reason).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvdoctor import __version__
from kvdoctor.errors import InputError
from kvdoctor.report.fingerprint import (fingerprint, fingerprint_parts, fingerprints, layer_group,  # noqa: F401 (re-exported)
                                  model_identity, unique_fingerprints)
from kvdoctor.load.jsonfile import read_bounded
from kvdoctor.model import Result

FORMAT_VERSION = 1
MAX_BASELINE_BYTES = 64 * 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Recorded(_Strict):
    fingerprint: str
    code: str
    model: str
    engine: str
    group: str
    key: str
    count: int = Field(1, ge=1)
    layers: list[int] = Field(default_factory=list)
    message: str = ""


class Accepted(_Strict):
    fingerprint: str
    reason: str = ""


class Baseline(_Strict):
    kvdoctor_baseline: int = Field(alias="kvdoctor-baseline")
    tool_version: Optional[str] = Field(None, alias="tool-version")
    findings: list[Recorded] = Field(default_factory=list)
    manual: list[Accepted] = Field(default_factory=list)


def load_baseline(path: str) -> Baseline:
    data = read_bounded(Path(path), MAX_BASELINE_BYTES, "baseline")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: baseline is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "kvdoctor-baseline" not in doc:
        raise InputError(f"{path}: not a kvdoctor baseline (no 'kvdoctor-baseline' key)")
    try:
        baseline = Baseline.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"{path}: baseline field {'.'.join(map(str, err['loc']))!r}: {err['msg']}") from None
    if baseline.kvdoctor_baseline != FORMAT_VERSION:
        raise InputError(f"{path}: baseline format {baseline.kvdoctor_baseline} is not supported "
                         f"(this kvdoctor writes {FORMAT_VERSION})")
    return baseline


def record(results: list[Result], root: Path) -> list[Recorded]:
    """Today's findings, one entry per fingerprint with its count, in a stable order."""
    entries: dict[str, Recorded] = {}
    for result in results:
        for finding in result.findings:
            parts = fingerprint_parts(result, finding, root)
            fp = fingerprint(parts)
            entry = entries.get(fp)
            if entry is None:
                entries[fp] = Recorded(fingerprint=fp, message=finding.message, count=1,
                                       layers=[] if finding.layer is None else [finding.layer], **parts)
            else:
                entry.count += 1
                if finding.layer is not None:
                    entry.layers = sorted(set(entry.layers) | {finding.layer})
    return sorted(entries.values(), key=lambda e: (e.model, e.engine, e.code, e.group, e.key))


def write_baseline(path: str, results: list[Result], root: Path, keep_manual: list[Accepted]) -> int:
    """Write today's findings (keeping the manual section); returns how many findings were recorded."""
    recorded = record(results, root)
    doc = {"kvdoctor-baseline": FORMAT_VERSION, "tool-version": __version__,
           "findings": [e.model_dump() for e in recorded],
           "manual": [a.model_dump() for a in keep_manual]}
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write baseline: {exc.strerror or exc}") from None
    return sum(e.count for e in recorded)


def apply_baseline(results: list[Result], baseline: Baseline, root: Path) -> int:
    """Drop the findings the baseline knows from each result; returns how many were dropped.

    Per fingerprint, up to the recorded count is suppressed, findings on the recorded layers first;
    anything beyond the count is new. A manual entry suppresses its fingerprint whatever the count.
    """
    budget: Counter[str] = Counter({e.fingerprint: e.count for e in baseline.findings})
    layers = {e.fingerprint: set(e.layers) for e in baseline.findings}
    accepted = {a.fingerprint for a in baseline.manual}
    suppressed = 0
    for result in results:
        fps = fingerprints(result, root)
        by_fp: dict[str, list[int]] = defaultdict(list)
        for i, fp in enumerate(fps):
            by_fp[fp].append(i)
        drop: set[int] = set()
        for fp, indices in by_fp.items():
            if fp in accepted:
                drop.update(indices)
                continue
            known = layers.get(fp, set())
            preferred = sorted(indices, key=lambda i: (result.findings[i].layer not in known, i))
            taken = preferred[:budget[fp]]
            budget[fp] -= len(taken)
            drop.update(taken)
        suppressed += len(drop)
        result.findings = [f for i, f in enumerate(result.findings) if i not in drop]
    return suppressed
