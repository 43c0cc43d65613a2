"""`kvdoctor triage`: name the known errors in a server log or a pasted traceback.

Each line loses its colour codes and its log prefixes (`(Worker_TP0 pid=123) ERROR 06-15 08:40:03
[file.py:962]`, `[2026-05-02 10:11:14 TP0]`, `[rank0]:`, `vllm-1  | `) and is matched against every
wording of every catalog error (`error.pattern` and `error.patterns`). On top of that:
- near-identical messages: when two entries match one line and one match lies inside the other's,
  the longer match wins, so a pattern that is a prefix of another entry's message never shadows it;
- wrapped messages: a message broken over two lines (a terminal's hard wrap, a logger's width) is
  matched on the two lines joined, counting only matches that cross the break;
- bare exceptions: a traceback that ends in `AssertionError` or `NotImplementedError` with no message
  is matched on its raising frame (file and line, or the statement, at a release the entry lists);
- generic GPU errors (device-side assert, illegal memory access): an entry whose `error.context` is
  set is named only when a nearby line matches the context (the cache, kernel or flag it is about);
  (every context regex must match some line within CONTEXT_WINDOW lines);
  otherwise the error is reported as unattributed, with the nearest engine frame or kernel as a hint;
- nothing known: the result says "unknown" and quotes the line it looked at (the last error line).
"""
from __future__ import annotations

import re
import sys
import weakref
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import msgspec

from kvdoctor.catalog import Catalog, Entry
from kvdoctor.errors import InputError

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
MAX_LINE_BYTES = 1 << 20  # a longer line is read in pieces
MAX_SHOWN = 300


CONTEXT_WINDOW = 40  # lines either side of a generic error searched for its context


class Hit(msgspec.Struct):
    entry: Entry
    lines: list[int] = msgspec.field(default_factory=list)
    text: str = ""  # where it was first found, colour codes removed
    how: str = "message"  # message, frame (a bare exception's raising frame) or context

    def to_json(self) -> dict:
        e = self.entry
        return {
            "code": e.code, "name": e.name, "severity": e.severity, "summary": e.summary,
            "engines": [r.model_dump() for r in e.engines],
            "error": {"class": e.error.class_, "message": e.error.message} if e.error else None,
            "matched_on": self.how,
            "lines": self.lines, "count": len(self.lines), "text": self.text,
            "prevented_by": e.preventers,
            "meaning": e.meaning.strip(),
            "fixes": [fix.model_dump(exclude_none=True) for fix in e.fixes],
            "references": e.references,
        }


class Report(msgspec.Struct):
    hits: list[Hit]
    lines_read: int
    unattributed: list[dict] = msgspec.field(default_factory=list)  # generic GPU errors no entry claims
    unknown: dict | None = None  # when nothing is known: the line looked at

    def to_json(self, source: str) -> dict:
        return {"source": source, "lines_read": self.lines_read, "matches": [h.to_json() for h in self.hits],
                "unattributed": self.unattributed, "unknown": self.unknown}


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

    def keys_in(self, flat: str) -> set[str]:
        """The literal keys (first 4 characters) that occur in a squeezed line."""
        return {flat[i:i + MIN_LITERAL] for i in range(len(flat) - MIN_LITERAL + 1)} & self.keys

    def candidates(self, flat: str, keys: set[str]) -> list[int]:
        """The patterns whose literal occurs in `flat` (a line with white-space runs squeezed to one
        space): its 4-character keys pick the few literals worth a substring test."""
        found = {index for key in keys for literal, index in self.literals[key] if literal in flat}
        return sorted(found.union(self.always))

    def spans(self, text: str, keys: set[str] | None = None) -> list[tuple[Entry, int, int]]:
        """(entry, start, end) of each entry matching `text`, less those inside a longer match.
        `keys`, when given, are the literal keys known to occur in `text` (a superset is fine)."""
        flat = " ".join(text.split())
        found: dict[str, tuple[Entry, int, int]] = {}
        for i in self.candidates(flat, self.keys_in(flat) if keys is None else keys):
            m = self.patterns[i][1].search(text)
            entry = self.patterns[i][0]
            if m and (entry.code not in found or m.end() - m.start() > found[entry.code][2] - found[entry.code][1]):
                found[entry.code] = (entry, m.start(), m.end())
        spans = list(found.values())
        return [a for a in spans
                if not any(b[1] <= a[1] and a[2] <= b[2] and b[2] - b[1] > a[2] - a[1] for b in spans)]


def quotes_statement(entry: Entry) -> bool:
    """An entry for a bare `assert` or `raise X()` quotes the statement: it is named from the frame
    that raised it (file and line, or the statement under that file), never from text alone."""
    return entry.error.message.startswith(("assert ", "raise "))


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
PREFIXES = [
    re.compile(r"^\s*\((?:[A-Za-z][\w.-]*)(?:\s+[\w.-]+)*\s+pid=\d+\)\s?"),  # (Worker_TP0 pid=1), (APIServer pid=45)
    re.compile(r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?"),  # vLLM
    re.compile(r"^\[\d{4}-\d\d-\d\d[ T][^\]]*\]\s?"),  # [2026-05-02 10:11:14 TP0], [2025-03-10T15:07:20Z]
    re.compile(r"^\[rank\d+\]:\s?"),
    re.compile(r"^[\w.-]+-\d+\s+\|\s"),  # docker compose: vllm-1  |
    re.compile(r"^\s*\|\s"),  # a CI log's gutter
    re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:.,]+Z?\s+(?:\|\s*)?(?:[A-Z]+\s*\|\s*)?(?:stderr\s*\|\s*)?"),
]
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
EXCEPTION = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?\s*$")
GENERIC_GPU = re.compile(r"device-side assert triggered|an illegal memory access was encountered|"
                         r"Assertion `.*` failed|misaligned address|CUDA error: an illegal instruction")
HINT = re.compile(r'File "[^"]*(?:vllm|sglang|mlx_lm)/[^"]+", line \d+, in \S+|\b\w*(?:Kernel|_kernel|_fwd|_bwd)\w*\b')
RAISE_LITERAL = re.compile(r"""^raise\s+[\w.]+\(\s*f?["']([^"'{]+)""")
MIN_RAISE_LITERAL = 25
ERRORISH = re.compile(r"\b\w*(?:Error|Exception)\b|\bERROR\b|\berror\b|Assertion|Traceback")


def clean(text: str) -> str:
    return ANSI.sub("", text).rstrip("\r\n")


def strip_prefixes(text: str) -> str:
    """The text of a log line without the prefixes loggers and containers put before it."""
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            m = prefix.match(text)
            if m and m.end() > 0:
                text, changed = text[m.end():], True
    return text


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


class FrameIndex:
    """Where each catalog error is raised, by file name: (entry, path, line, statement)."""

    def __init__(self, catalog: Catalog):
        self.by_name: dict[str, list[tuple[Entry, str, int]]] = {}
        self.entries = [e for e in catalog.entries.values() if e.error is not None]
        for entry in self.entries:
            for site in [entry.error.source, *entry.error.sites]:
                for path, line in re.findall(r"([\w/.-]+\.py):(\d+)", site.split(" @ ")[0]):
                    path = path.removeprefix("python/")
                    self.by_name.setdefault(path.rsplit("/", 1)[-1], []).append((entry, path, int(line)))

    def raising(self, code: str) -> Entry | None:
        """The entry whose message begins with the string literal of a `raise X("...` frame line: a
        log cut off before its exception line still shows the statement that raised it."""
        m = RAISE_LITERAL.match(code)
        if not m or len(m.group(1)) < MIN_RAISE_LITERAL:
            return None
        literal = m.group(1)
        for entry in self.entries:
            message = entry.error.message
            if message.startswith(literal) or any(re.match(p, literal) for p in entry.error.all_patterns):
                return entry
        return None

    def match(self, cls: str, frame: tuple[str, int, str], code: str) -> Entry | None:
        path, line, _ = frame
        for entry, site_path, site_line in self.by_name.get(path.rsplit("/", 1)[-1], []):
            if not path.endswith(site_path) or entry.error.class_.rsplit(".", 1)[-1] != cls.rsplit(".", 1)[-1]:
                continue
            if site_line == line or (quotes_statement(entry) and code.strip() == entry.error.message.strip()):
                return entry
        return None


_PREPARED: "weakref.WeakKeyDictionary[Catalog, tuple[Matcher, FrameIndex]]" = weakref.WeakKeyDictionary()


def prepared(catalog: Catalog) -> tuple[Matcher, FrameIndex]:
    """The compiled patterns and frame index of a catalog, built once per catalog object."""
    if catalog not in _PREPARED:
        _PREPARED[catalog] = (Matcher(catalog), FrameIndex(catalog))
    return _PREPARED[catalog]


def triage_report(lines: Iterable[tuple[int, str]], catalog: Catalog) -> Report:
    """The known errors in these lines, in order of first appearance, with what else was found."""
    matcher, frames = prepared(catalog)
    hits: dict[str, Hit] = {}
    pending: list[tuple[Entry, int, str]] = []  # entries that need their context checked
    bodies: list[tuple[int, str]] = []
    count = 0

    def add(entry: Entry, number: int, text: str, how: str = "message") -> None:
        if entry.error is not None and entry.error.context and how != "context":
            pending.append((entry, number, text))
            return
        hits.setdefault(entry.code, Hit(entry, [], text.strip()[:MAX_SHOWN], how)).lines.append(number)

    previous: tuple[int, str] | None = None
    previous_flat, previous_keys = "", set()
    last_frame: tuple[str, int, str] | None = None
    frame_code: str | None = None
    for number, raw in lines:
        count = number
        text = strip_prefixes(raw)
        bodies.append((number, text))
        flat = " ".join(text.split())
        keys = matcher.keys_in(flat)
        spans = matcher.spans(text, keys)
        for entry, _, _ in spans:
            add(entry, number, text)
        if previous is not None and previous[1].strip() and text.strip():
            head, tail = previous[1].rstrip(), text.lstrip()
            for sep in (" ", ""):
                # a literal crossing the break starts in the last characters of the previous line
                edge = matcher.keys_in(previous_flat[-(MIN_LITERAL - 1):] + sep + flat[:MIN_LITERAL - 1])
                for entry, start, end in matcher.spans(head + sep + tail, previous_keys | keys | edge):
                    if start < len(head) and end > len(head) + len(sep):
                        add(entry, previous[0], head + sep + tail)
        frame = FRAME.match(text)
        if frame:
            last_frame, frame_code = (frame.group(1), int(frame.group(2)), frame.group(3)), None
        elif last_frame is not None and frame_code is None and text.strip() and not EXCEPTION.match(text):
            frame_code = text.strip()
        if frame_code is not None and frame_code == text.strip() and not spans:
            entry = frames.raising(frame_code)
            if entry is not None:
                add(entry, number, f"{frame_code} (raising frame {last_frame[0]}:{last_frame[1]})", "frame")
        exception = EXCEPTION.match(text)
        if exception and last_frame is not None and not spans and not (exception.group(2) or "").strip():
            entry = frames.match(exception.group(1), last_frame, frame_code or "")
            if entry is not None:
                add(entry, number, f'{text.strip()} (raised at {last_frame[0]}:{last_frame[1]})', "frame")
        if exception:
            last_frame = None
        previous, previous_flat, previous_keys = (number, text), flat, keys

    for entry, number, text in pending:
        if _context_near(entry, number, bodies):
            add(entry, number, text, "context")
    for hit in hits.values():
        hit.lines = sorted(set(hit.lines))
    ordered = sorted(hits.values(), key=lambda h: h.lines[0])
    unattributed = [] if ordered else _unattributed(bodies)
    unknown = None
    if not ordered and not unattributed:
        unknown = _looked_at(bodies)
    return Report(ordered, count, unattributed, unknown)


def _context_near(entry: Entry, number: int, bodies: list[tuple[int, str]]) -> bool:
    near = [text for n, text in bodies if abs(n - number) <= CONTEXT_WINDOW]
    return all(any(re.search(c, text) for text in near) for c in entry.error.context)


def _unattributed(bodies: list[tuple[int, str]]) -> list[dict]:
    """Generic GPU errors with the nearest line that names an engine frame or a kernel."""
    found = []
    for index, (number, text) in enumerate(bodies):
        if not GENERIC_GPU.search(text):
            continue
        hint = None
        for distance in range(1, CONTEXT_WINDOW + 1):
            for j in (index - distance, index + distance):
                if 0 <= j < len(bodies) and j != index and (m := HINT.search(bodies[j][1])):
                    hint = {"line": bodies[j][0], "text": m.group(0)}
                    break
            if hint:
                break
        if hint is None and (m := HINT.search(text)):
            hint = {"line": number, "text": m.group(0)}
        found.append({"line": number, "text": text.strip()[:MAX_SHOWN], "hint": hint})
        if len(found) >= 5:
            break
    return found


def _looked_at(bodies: list[tuple[int, str]]) -> dict | None:
    """The line an unknown log was judged on: its last exception line, else its last error-ish line."""
    for test in (lambda t: EXCEPTION.match(t), lambda t: ERRORISH.search(t), lambda t: t.strip()):
        for number, text in reversed(bodies):
            if test(text):
                return {"line": number, "text": text.strip()[:MAX_SHOWN]}
    return None


def triage_lines(lines: Iterable[tuple[int, str]], catalog: Catalog) -> tuple[list[Hit], int]:
    """The known errors in these lines, in order of first appearance, and how many lines were read."""
    report = triage_report(lines, catalog)
    return report.hits, report.lines_read


def triage_file(path: str, catalog: Catalog) -> Report:
    """Triage a file, or standard input for '-'."""
    if path == "-":
        return triage_report(read_lines(sys.stdin.buffer), catalog)
    file = Path(path)
    if file.is_dir():
        raise InputError(f"{path}: expected a log file, found a directory")
    try:
        with file.open("rb") as fh:
            return triage_report(read_lines(fh), catalog)
    except OSError as exc:
        raise InputError(f"{path}: cannot read log: {exc.strerror or exc}") from None
