"""Which catalog entries a text names: every wording of every catalog error (`error.pattern` and
`error.patterns`), each message's first sentence alone where it is distinctive, filtered by the
literals a pattern cannot match without. `kvdoctor triage` reads logs with it, and the dry-run rule
names what an engine raised with it.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdoctor.catalog import Catalog, Entry


class Matcher:
    def __init__(self, catalog: Catalog):
        self.patterns = [(entry, re.compile(p)) for entry in catalog.entries.values()
                         if entry.error is not None and not quotes_statement(entry)
                         for p in _with_heads(entry.error.all_patterns)]
        self.always: list[int] = []  # patterns without a literal to filter on
        self.literals: dict[str, list[tuple[str, int]]] = {}  # first 4 characters -> (literal, pattern)
        for index, (_entry, compiled) in enumerate(self.patterns):
            literals = required_literals(compiled.pattern)
            if literals is None:
                self.always.append(index)
            else:
                for literal in literals:
                    self.literals.setdefault(literal[:MIN_LITERAL], []).append((literal, index))
        self.keys = set(self.literals)
        self.ends = {literal[-MIN_LITERAL:] for pairs in self.literals.values() for literal, _ in pairs}

    def keys_in(self, flat: str) -> set[str]:
        """The literal keys (first 4 characters) that occur in a squeezed line."""
        return {flat[i:i + MIN_LITERAL] for i in range(len(flat) - MIN_LITERAL + 1)} & self.keys

    def ends_in(self, flat: str) -> set[str]:
        """The literal ends (last 4 characters) that occur in a squeezed line."""
        return {flat[i:i + MIN_LITERAL] for i in range(len(flat) - MIN_LITERAL + 1)} & self.ends

    def rooms(self, flat: str) -> dict[str, int]:
        """Each literal key in a squeezed line, with the characters from its last occurrence to the
        end of the line: a literal that runs past the line's end is longer than that."""
        n = len(flat)
        return {key: n - i for i in range(n - MIN_LITERAL + 1) if (key := flat[i:i + MIN_LITERAL]) in self.keys}

    def reaches(self, flat: str) -> dict[str, int]:
        """Each literal end in a squeezed line, with the characters from the line's start to the end
        of its first occurrence: a literal that began on an earlier line is longer than that."""
        return {end: i + MIN_LITERAL for i in reversed(range(len(flat) - MIN_LITERAL + 1))
                if (end := flat[i:i + MIN_LITERAL]) in self.ends}

    def running_past(self, rooms: dict[str, int]) -> list[tuple[str, int]]:
        """(literal, pattern) of the literals that may begin on a line and run past its end: those
        whose key is in the line and which are longer than the key's room (see `rooms`)."""
        return [(literal, index) for key, room in rooms.items() for literal, index in self.literals[key]
                if len(literal) > room]

    def candidates(self, flat: str, keys: set[str]) -> list[int]:
        """The patterns whose literal occurs in `flat` (a line with white-space runs squeezed to one
        space): its 4-character keys pick the few literals worth a substring test."""
        found = {index for key in keys for literal, index in self.literals[key] if literal in flat}
        return sorted(found.union(self.always))

    def spans(self, text: str, keys: set[str] | None = None,
              only: list[int] | None = None) -> list[tuple[Entry, int, int]]:
        """(entry, start, end) of each entry matching `text`, less those inside a longer match.
        `keys`, when given, are the literal keys known to occur in `text` (a superset is fine);
        `only`, when given, are the patterns already known to be the candidates."""
        if only is None:
            flat = " ".join(text.split())
            only = self.candidates(flat, self.keys_in(flat) if keys is None else keys)
        found: dict[str, tuple[Entry, int, int]] = {}
        for i in only:
            m = self.patterns[i][1].search(text)
            entry = self.patterns[i][0]
            if m and (entry.code not in found or m.end() - m.start() > found[entry.code][2] - found[entry.code][1]):
                found[entry.code] = (entry, m.start(), m.end())
        spans = list(found.values())
        return [a for a in spans
                if not any(b[1] <= a[1] and a[2] <= b[2] and b[2] - b[1] > a[2] - a[1] for b in spans)]


def code_for(catalog: Catalog, engine: str, error_class: str, message: str) -> str | None:
    """The catalog code whose error, as this engine raises it, is this exception (its class, and a
    pattern matching its message); the lowest code when several are."""
    matches = [entry for entry, _, _ in Matcher(catalog).spans(message)
               if entry.error is not None and entry.error.class_ == error_class
               and any(e.name == engine for e in entry.engines)]
    return min(matches, key=lambda e: e.code).code if matches else None


def quotes_statement(entry: Entry) -> bool:
    """An entry for a bare `assert` or `raise X()` quotes the statement: it is named from the frame
    that raised it (file and line, or the statement under that file), never from text alone."""
    return entry.error is not None and entry.error.message.startswith(("assert ", "raise "))


def _with_heads(patterns: list[str]) -> list[str]:
    """The patterns plus, for a message of several sentences, its first sentence alone when that
    sentence is distinctive on its own: logs and pasted excerpts often cut a message after it."""
    out = list(patterns)
    for pattern in patterns:
        m = SENTENCE_END.search(pattern)
        if m and not pattern.startswith("(") and "|" not in pattern[:m.start()]:
            head = pattern[:m.start()]
            plain = re.sub(r"\\s\+|\.\+\?|\\", "", head)  # the head's text without its regex syntax
            if len(plain) >= MIN_HEAD_LITERAL and head not in out:
                out.append(head)
    return out


SENTENCE_END = re.compile(r"\\\.(?:\\s\+| )")  # an escaped period followed by white space
MIN_HEAD_LITERAL = 40


# Most log lines match no pattern, and a plain substring test is far cheaper than a regex search, so
# each pattern gets the literal text every match must contain (one per top-level branch); the regex
# runs only on lines holding one of them. A `\s+` in a pattern counts as one space, and the line is
# tested with its white-space runs squeezed to one space.
MIN_LITERAL = 4
WHITESPACE_RUN = "\\s+"
QUANTIFIERS = "?*+{"
_UNREADABLE = re.compile(r"\\[xuUN0-9]")  # escapes whose text is not the character itself


def required_literals(pattern: str) -> list[str] | None:
    """Substrings one of which every match contains; None when the pattern cannot be read that simply
    (inline flags, numeric escapes, a branch without a literal of MIN_LITERAL characters)."""
    if (pattern.startswith("(?") and not pattern.startswith("(?:")) or _UNREADABLE.search(pattern):
        return None
    branches = _split_top(pattern)
    if len(branches) == 1 and pattern.startswith("(") and _group_end(pattern, 0) == len(pattern):
        inner = 3 if pattern.startswith("(?:") else 1
        branches = _split_top(pattern[inner:-1])  # (?:A|B) or (A|B) around the whole pattern
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
        if branch.startswith(WHITESPACE_RUN, i) or (branch.startswith("\\s", i) and branch[i + 2:i + 3] not in "?*{"):
            run += " "  # one or more white-space characters: one space in the normalised line
            i += len(WHITESPACE_RUN) if branch.startswith(WHITESPACE_RUN, i) else 2
            continue
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


# Prefixes that loggers, process managers and containers put before the text, removed one after
# another from the start of a line.
