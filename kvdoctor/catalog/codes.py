"""What a catalog code, a rule name and a reference may look like (no pydantic: the loader and the
schema both read these)."""
from __future__ import annotations

import re

CODE_RE = re.compile(r"^[A-Z]{2,5}[0-9]{3}$")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

# A reference is public: an engine source link pinned to a release tag or a commit, an issue or pull
# request as owner/repo#N, or one of kvdoctor's own docs. Free text may follow the first word.
PINNED_URL_RE = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(?:blob|tree)/(?:v?\d[\w.+-]*|[0-9a-f]{7,40})/\S+$")
THREAD_RE = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")
DOCS_RE = re.compile(r"^docs/[\w./-]+\.md(?:#[\w-]+)?$")


def reference_problem(reference: str) -> str | None:
    """Why `reference` is not a public reference, or None when it is one."""
    head = reference.split()[0] if reference.strip() else ""
    if PINNED_URL_RE.match(head) or THREAD_RE.match(head) or DOCS_RE.match(head):
        return None
    if head.startswith("https://github.com/"):
        return f"{head}: a source link must be pinned to a release tag or a commit, not a branch"
    return (f"{reference!r} is not a public reference: use a pinned source URL, owner/repo#N or docs/...")
