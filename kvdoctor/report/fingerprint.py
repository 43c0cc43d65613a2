"""Model identities and finding fingerprints (see baseline.py for what a fingerprint holds and why).

Kept apart from the baseline file's schema so that reports, which print fingerprints, do not import
pydantic.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from functools import cache
from pathlib import Path

from kvdoctor.model import Finding, Result


def model_identity(target: str, root: Path) -> str:
    """A model's name that stays the same across machines: its path relative to the project root
    (absolute when outside it), or the Hugging Face id it was given as."""
    return project_path(target, root) if os.path.exists(target) else target


def project_path(path: str | Path, root: Path) -> str:
    """A path as the repository sees it: relative to the project root, posix; absolute when outside."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, os.path.abspath(root))
    chosen = absolute if relative.startswith(os.pardir) else relative
    return chosen if os.sep == "/" else Path(chosen).as_posix()


def layer_group(result: Result, finding: Finding) -> str:
    if finding.layer is None:
        return "model"
    kind = next((row["kind"] for row in result.layers if row["index"] == finding.layer), None)
    return kind or "unlisted-layer"


def fingerprint_parts(result: Result, finding: Finding, root: Path) -> dict[str, str]:
    return {"code": finding.code, "model": model_identity(result.target, root), "engine": result.engine,
            "group": layer_group(result, finding), "key": finding.key or ""}


def fingerprint(parts: dict[str, str]) -> str:
    text = "\x1f".join(parts[k] for k in ("code", "model", "engine", "group", "key"))
    return sha256(text.encode("utf-8")).hexdigest()[:24]


def sha256(data: bytes):
    """The SHA-256 digest of `data`, from CPython's own implementation where the build has it.

    hashlib would load OpenSSL first (3 ms, as long as a static check of a 7B model's checkpoint),
    and give the same digest: SHA-256 is one function whichever library computes it."""
    return _sha256_constructor()(data)


@cache
def _sha256_constructor():
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256
        else:
            from _sha256 import sha256  # type: ignore[import-not-found]  # not in typeshed
    except ImportError:  # a build without CPython's own hashes (or another Python): OpenSSL's
        from hashlib import sha256
    return sha256


def fingerprints(result: Result, root: Path) -> list[str]:
    return [fingerprint(fingerprint_parts(result, f, root)) for f in result.findings]


def unique_fingerprints(result: Result, root: Path) -> list[str]:
    """One id per finding for SARIF and GitLab: a repeated fingerprint gets ':2', ':3', ... in order."""
    seen: Counter[str] = Counter()
    out = []
    for fp in fingerprints(result, root):
        seen[fp] += 1
        out.append(fp if seen[fp] == 1 else f"{fp}:{seen[fp]}")
    return out
