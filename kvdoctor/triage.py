"""`kvdoctor triage`: name the known errors in a server log or a pasted traceback.

Each line (colour codes removed) is matched against the catalog's `error.pattern` regexes. Two
details make this work on real logs:
- near-identical messages: when two entries match one line and one match lies inside the other's,
  the longer match wins, so a pattern that is a prefix of another entry's message never shadows it;
- wrapped messages: a message broken over two lines (a terminal's hard wrap, a logger's width) is
  matched on the two lines joined, counting only matches that cross the break.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from kvdoctor.catalog import Catalog, Entry
from kvdoctor.errors import InputError

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
MAX_LINE_BYTES = 1 << 20  # a longer line is read in pieces
MAX_SHOWN = 300


@dataclass
class Hit:
    entry: Entry
    lines: list[int] = field(default_factory=list)
    text: str = ""  # where it was first found, colour codes removed

    def to_json(self) -> dict:
        e = self.entry
        return {
            "code": e.code, "name": e.name, "severity": e.severity, "summary": e.summary,
            "error": {"class": e.error.class_, "message": e.error.message} if e.error else None,
            "lines": self.lines, "count": len(self.lines), "text": self.text,
            "meaning": e.meaning.strip(),
            "fixes": [fix.model_dump(exclude_none=True) for fix in e.fixes],
            "references": e.references,
        }


class Matcher:
    def __init__(self, catalog: Catalog):
        self.patterns = [(entry, re.compile(entry.error.pattern))
                         for entry in catalog.entries.values() if entry.error is not None]
        self.always: list[int] = []  # patterns without a literal to filter on
        self.literals: list[tuple[str, int]] = []  # (literal, pattern index)
        for index, (entry, _) in enumerate(self.patterns):
            literals = required_literals(entry.error.pattern)
            if literals is None:
                self.always.append(index)
            else:
                self.literals += [(literal, index) for literal in literals]

    def spans(self, text: str) -> list[tuple[Entry, int, int]]:
        """(entry, start, end) of each entry matching `text`, less those inside a longer match."""
        candidates = sorted({index for literal, index in self.literals if literal in text}.union(self.always))
        found = [(self.patterns[i][0], m.start(), m.end()) for i in candidates if (m := self.patterns[i][1].search(text))]
        return [a for a in found
                if not any(b[1] <= a[1] and a[2] <= b[2] and b[2] - b[1] > a[2] - a[1] for b in found)]


# Most log lines match no pattern, and a plain substring test is far cheaper than a regex search, so
# each pattern gets the literal text every match must contain (one per top-level branch); the regex
# runs only on lines holding one of them.
MIN_LITERAL = 4
QUANTIFIERS = "?*+{"
_UNREADABLE = re.compile(r"\\[xuUN0-9]")  # escapes whose text is not the character itself


def required_literals(pattern: str) -> list[str] | None:
    """Substrings one of which every match contains; None when the pattern cannot be read that simply
    (inline flags, numeric escapes, a branch without a literal of MIN_LITERAL characters)."""
    if (pattern.startswith("(?") and not pattern.startswith("(?:")) or _UNREADABLE.search(pattern):
        return None
    branches = _split_top(pattern)
    if len(branches) == 1 and pattern.startswith("(?:") and _group_end(pattern, 0) == len(pattern):
        branches = _split_top(pattern[3:-1])  # (?:A|B) around the whole pattern
    literals = [_longest_literal(branch) for branch in branches]
    return literals if all(len(lit) >= MIN_LITERAL for lit in literals) else None


def _group_end(pattern: str, i: int) -> int:
    """The index just past the group `(...)` or class `[...]` that opens at i."""
    if pattern[i] == "[":
        j = i + 1
        j += pattern.startswith("^", j)
        j += pattern.startswith("]", j)  # a ']' first in a class is a literal
        while j < len(pattern) and pattern[j] != "]":
            j += 2 if pattern[j] == "\\" else 1
        return j + 1
    depth, j = 0, i
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            j = _group_end(pattern, j)
            continue
        depth += (c == "(") - (c == ")")
        j += 1
        if depth == 0:
            return j
    return j


def _split_top(pattern: str) -> list[str]:
    """Split at each '|' outside groups, classes and escapes."""
    parts, start, i = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
        elif c in "([":
            i = _group_end(pattern, i)
        elif c == "|":
            parts.append(pattern[start:i])
            start = i = i + 1
        else:
            i += 1
    parts.append(pattern[start:])
    return parts


def _skip_quantifier(branch: str, i: int) -> int:
    j = branch.find("}", i) + 1 if branch[i] == "{" else i + 1
    if j == 0:  # a '{' with no '}' is a literal brace to re; treat it as a break all the same
        j = i + 1
    return j + (j < len(branch) and branch[j] in "?+")  # lazy or possessive


def _longest_literal(branch: str) -> str:
    """The longest run of characters that stand for themselves, with no quantifier on any of them."""
    runs, run, i = [], "", 0
    while i < len(branch):
        c = branch[i]
        if c == "\\" and i + 1 < len(branch) and not branch[i + 1].isalnum():
            char, i = branch[i + 1], i + 2  # an escaped punctuation character
        elif c == "\\" or c in ".^$([" or c in QUANTIFIERS:
            runs.append(run)
            run = ""
            if c in "([":
                i = _group_end(branch, i)
            elif c in QUANTIFIERS:
                i = _skip_quantifier(branch, i)
            else:
                i += 2 if c == "\\" else 1
            continue
        else:
            char, i = c, i + 1
        if i < len(branch) and branch[i] in QUANTIFIERS:  # the character may repeat or be absent
            runs.append(run)
            run = ""
            i = _skip_quantifier(branch, i)
        else:
            run += char
    runs.append(run)
    return max(runs, key=len)


def clean(text: str) -> str:
    return ANSI.sub("", text).rstrip("\r\n")


def read_lines(source: BinaryIO) -> Iterator[tuple[int, str]]:
    """(line number, text) with colour codes removed; a carriage return starts a new piece of text
    on the same line (progress bars), and an overlong line comes in pieces."""
    number, at_start = 0, True
    while True:
        raw = source.readline(MAX_LINE_BYTES)
        if not raw:
            return
        if at_start:
            number += 1
        at_start = raw.endswith(b"\n")
        for piece in raw.decode("utf-8", errors="replace").rstrip("\n").split("\r"):
            yield number, clean(piece)


def triage_lines(lines: Iterable[tuple[int, str]], catalog: Catalog) -> tuple[list[Hit], int]:
    """The known errors in these lines, in order of first appearance, and how many lines were read."""
    matcher = Matcher(catalog)
    hits: dict[str, Hit] = {}
    count = 0

    def add(entry: Entry, number: int, text: str) -> None:
        hits.setdefault(entry.code, Hit(entry, [], text.strip()[:MAX_SHOWN])).lines.append(number)

    previous: tuple[int, str] | None = None
    for number, text in lines:
        count = number
        for entry, _, _ in matcher.spans(text):
            add(entry, number, text)
        if previous is not None and previous[1].strip() and text.strip():
            head = previous[1].rstrip()
            tail = text.lstrip()
            for sep in (" ", ""):
                for entry, start, end in matcher.spans(head + sep + tail):
                    if start < len(head) and end > len(head) + len(sep):
                        add(entry, previous[0], head + sep + tail)
        previous = (number, text)
    for hit in hits.values():
        hit.lines = sorted(set(hit.lines))
    return sorted(hits.values(), key=lambda h: h.lines[0]), count


def triage_file(path: str, catalog: Catalog) -> tuple[list[Hit], int]:
    """Triage a file, or standard input for '-'."""
    if path == "-":
        return triage_lines(read_lines(sys.stdin.buffer), catalog)
    file = Path(path)
    if file.is_dir():
        raise InputError(f"{path}: expected a log file, found a directory")
    try:
        with file.open("rb") as fh:
            return triage_lines(read_lines(fh), catalog)
    except OSError as exc:
        raise InputError(f"{path}: cannot read log: {exc.strerror or exc}") from None
