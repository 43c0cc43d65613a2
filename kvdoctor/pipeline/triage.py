"""`kvdoctor triage`: name the known errors in a server log or a pasted traceback.

Each line loses its colour codes and its log prefixes (`(Worker_TP0 pid=123) ERROR 06-15 08:40:03
[file.py:962]`, `[2026-05-02 10:11:14 TP0]`, `[rank0]:`, `vllm-1  | `) and is matched against every
wording of every catalog error (`error.pattern` and `error.patterns`). On top of that:
- near-identical messages: when two entries match one line and one match lies inside the other's,
  the longer match wins, so a pattern that is a prefix of another entry's message never shadows it;
- wrapped messages: a message broken over up to MAX_WRAP_LINES lines (a terminal's hard wrap, a
  logger's width, a comment box) is matched on the lines joined, each break rejoined with a space or
  with nothing, counting only matches that begin on the first line and end on the last; the lines
  joined must belong to one record (see `_continues`);
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
from itertools import product
from typing import BinaryIO, Iterable, Iterator, NamedTuple

import msgspec

from kvdoctor.catalog import Catalog, Entry
from kvdoctor.catalog.matcher import MIN_LITERAL, Matcher, quotes_statement
from kvdoctor.checks import preventers
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
            "prevented_by": preventers(e),
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


PREFIXES = [
    re.compile(r"^\s*\((?:[A-Za-z][\w.-]*)(?:\s+[\w.-]+)*\s+pid=\d+\)\s?"),  # (Worker_TP0 pid=1), (APIServer pid=45)
    re.compile(r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?"),  # vLLM
    re.compile(r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+[\w./-]+\.py:\d+\]\s?"),  # vLLM 0.4-0.6
    re.compile(r"^\[\d{4}-\d\d-\d\d[ T][^\]]*\]\s?"),  # [2026-05-02 10:11:14 TP0], [2025-03-10T15:07:20Z]
    re.compile(r"^\[rank\d+\]:\s?"),
    re.compile(r"^[\w.-]+-\d+\s+\|\s"),  # docker compose: vllm-1  |
    re.compile(r"^\s*\|\s"),  # a CI log's gutter
    re.compile(r"^\s*(?:>\s?)+"),  # a quoted reply in a GitHub comment or an e-mail
    re.compile(r"^\s*│\s?"),  # the left border of a boxed (rich) traceback
    re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:.,]+Z?\s+(?:\|\s*)?(?:[A-Z]+\s*\|\s*)?(?:stderr\s*\|\s*)?"),
]
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
EXCEPTION = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?\s*$")
GENERIC_GPU = re.compile(r"device-side assert triggered|an illegal memory access was encountered|"
                         r"Assertion `.*` failed|misaligned address|CUDA error: an illegal instruction")
HINT = re.compile(r'File "[^"]*(?:vllm|sglang|mlx_lm)/[^"]+", line \d+, in \S+|\b\w*(?:Kernel|_kernel|_fwd|_bwd)\w*\b')
RAISE_LITERAL = re.compile(r"""^raise\s+[\w.]+\(\s*f?["']([^"'{]+)""")
MIN_RAISE_LITERAL = 25
MIN_SHOWN_STATEMENT = 24  # a printed raise line cut shorter than this is not read as a statement's start
ERRORISH = re.compile(r"\b\w*(?:Error|Exception)\b|\bERROR\b|\berror\b|Assertion|Traceback")


def clean(text: str) -> str:
    return ANSI.sub("", text).rstrip("\r\n")


BOX_RIGHT = re.compile(r"\s*│\s*$")  # the right border of a boxed (rich) traceback
MAX_WRAP_LINES = 4


def strip_prefixes(text: str) -> str:
    """The text of a log line without the prefixes loggers and containers put before it."""
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            m = prefix.match(text)
            if m and m.end() > 0:
                text, changed = text[m.end():], True
    return BOX_RIGHT.sub("", text) if "│" in text else text


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
        # (file name, function) -> the bare-assert entries that are the only bare asserts of that function
        self.by_function: dict[tuple[str, str], list[tuple[Entry, str]]] = {}
        # (file name, function) -> the entries with a raise or assert there: (entry, path, its first source line)
        self.by_statement: dict[tuple[str, str], list[tuple[Entry, str, str]]] = {}
        self.entries = [e for e in catalog.entries.values() if e.error is not None]
        for entry in self.entries:
            for site in [entry.error.source, *entry.error.sites]:
                for path, line in re.findall(r"([\w/.-]+\.py):(\d+)", site.split(" @ ")[0]):
                    path = path.removeprefix("python/")
                    self.by_name.setdefault(path.rsplit("/", 1)[-1], []).append((entry, path, int(line)))
            for function in entry.error.functions if quotes_statement(entry) else []:
                path, name = function.split(" in ")
                self.by_function.setdefault((path.rsplit("/", 1)[-1], name), []).append((entry, path))
            for statement in entry.error.statements:
                where, shown = statement.split(": ", 1)
                path, name = where.split(" in ")
                self.by_statement.setdefault((path.rsplit("/", 1)[-1], name), []).append((entry, path, shown))

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

    def stated(self, frame: tuple[str, int, str], code: str) -> Entry | None:
        """The entry whose raise or assert begins with the source line this frame prints (or with its
        first MIN_SHOWN_STATEMENT characters or more, a paste cut mid-line): a traceback cut at the
        raising frame, before its message. None unless exactly one entry's statement fits."""
        path, _, function = frame
        shown = path.rsplit("...", 1)[-1]
        code = code.strip()
        fits = {entry.code: entry for entry, site_path, line in self.by_statement.get((path.rsplit("/", 1)[-1], function), [])
                if (path.endswith(site_path) or (shown != path and site_path.endswith(shown.lstrip("/"))))
                and (code == line or (len(code) >= MIN_SHOWN_STATEMENT and line.startswith(code)))}
        return next(iter(fits.values())) if len(fits) == 1 else None

    def match(self, cls: str, frame: tuple[str, int, str], code: str) -> Entry | None:
        """The entry raised at this frame: a listed site (file and line), the statement the frame
        shows, or a function whose only bare asserts are the entry's (at any line: a build between
        releases moves lines)."""
        path, line, function = frame
        shown = path.rsplit("...", 1)[-1]  # a pasted path is often shortened: ".../mem_cache/pool.py"
        name = path.rsplit("/", 1)[-1]
        for entry, site_path in self.by_function.get((name, function), []):
            same_file = path.endswith(site_path) or (shown != path and site_path.endswith(shown.lstrip("/")))
            other_statement = code.strip().startswith("assert") and code.strip() != entry.error.message.strip()
            if same_file and not other_statement and cls.rsplit(".", 1)[-1] == entry.error.class_ == "AssertionError":
                return entry
        for entry, site_path, site_line in self.by_name.get(name, []):
            same_file = path.endswith(site_path) or (shown != path and site_path.endswith(shown.lstrip("/")))
            if not same_file or entry.error.class_.rsplit(".", 1)[-1] != cls.rsplit(".", 1)[-1]:
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

    window: list[Line] = []  # the lines a wrapped message may span, the current one last
    last_frame: tuple[str, int, str] | None = None
    frame_code: str | None = None
    stated: tuple[Entry, int, str] | None = None  # a raise site shown at the last frame, not yet resolved
    for number, raw in lines:
        count = number
        text = strip_prefixes(raw)
        bodies.append((number, text))
        flat = " ".join(text.split())
        keys = matcher.keys_in(flat)
        found = matcher.candidates(flat, keys)
        spans = matcher.spans(text, only=found)
        for entry, _, _ in spans:
            add(entry, number, text)
        line = Line(number, text, raw[:raw.find(text)].strip(), flat, keys, found, [])
        if _continues(window, line):
            _note_break(matcher, window[-1], line)
            window = [*window, line][-MAX_WRAP_LINES:]
        else:
            window = [line] if flat else []
        for start in range(len(window) - 1):
            for entry, joined in _wrapped(matcher, window[start:]):
                add(entry, window[start].number, joined)
        if stated is not None and text.lstrip().startswith("Traceback"):  # a new traceback: the last one was cut
            add(*stated, "frame")
            stated = None
        frame = FRAME.match(text)
        if frame:
            last_frame, frame_code, stated = (frame.group(1), int(frame.group(2)), frame.group(3)), None, None
        elif last_frame is not None and frame_code is None and text.strip() and not EXCEPTION.match(text):
            frame_code = text.strip()
        if frame_code is not None and frame_code == text.strip() and not spans:
            entry = frames.raising(frame_code)
            if entry is not None:
                add(entry, number, f"{frame_code} (raising frame {last_frame[0]}:{last_frame[1]})", "frame")
            elif (entry := frames.stated(last_frame, frame_code)) is not None:
                stated = (entry, number, f"{frame_code} (raising frame {last_frame[0]}:{last_frame[1]})")
        exception = EXCEPTION.match(text)
        if exception and stated is not None:
            if not spans and exception.group(1).rsplit(".", 1)[-1] == stated[0].error.class_.rsplit(".", 1)[-1]:
                add(*stated, "frame")
            stated = None
        if exception and last_frame is not None and not spans and not (exception.group(2) or "").strip():
            entry = frames.match(exception.group(1), last_frame, frame_code or "")
            if entry is not None:
                add(entry, number, f'{text.strip()} (raised at {last_frame[0]}:{last_frame[1]})', "frame")
        if exception:
            last_frame = None

    if stated is not None:  # the log ends before the exception's line: the frame shows the raise
        add(*stated, "frame")
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


class Line(NamedTuple):
    number: int
    text: str  # without its prefixes
    prefix: str  # the prefixes removed, white space trimmed
    flat: str  # white-space runs squeezed to one space
    keys: set[str]  # the matcher's literal keys in `flat`
    found: list[int]  # the patterns whose literal is in `flat` (and those without a literal)
    tails: list[tuple[str, int]]  # the literals that may run on into the next line (see _note_break)


def _continues(window: list[Line], line: Line) -> bool:
    """Whether `line` may continue a message begun in the window: not blank, not a traceback's frame
    or header, and with no prefix or the same prefix as the window's first line (a logger repeats
    its prefix on each line of one record, and a terminal's wrap adds none; another prefix is another
    record)."""
    if not window or not line.flat or FRAME.match(line.text) or line.flat.startswith("Traceback"):
        return False
    return line.prefix in ("", window[0].prefix)


def _note_break(matcher: Matcher, a: Line, b: Line) -> None:
    """Fill in a.tails: the literals that may begin on a and run across the break into b. Such a
    literal begins with a key of a that it runs past a's end from, and either ends with an end of
    b that it reaches or is longer than b (it may end on a later line). Keys and ends that lie
    across the break itself (rejoined with a space or with nothing) count as at the break."""
    rooms, reaches = matcher.rooms(a.flat), matcher.reaches(b.flat)
    for sep in (" ", ""):
        across = a.flat[-(MIN_LITERAL - 1):] + sep + b.flat[:MIN_LITERAL - 1]
        rooms.update(dict.fromkeys(matcher.keys_in(across), 0))
        reaches.update(dict.fromkeys(matcher.ends_in(across), 0))
    a.tails[:] = [(literal, index) for literal, index in matcher.running_past(rooms)
                  if len(literal) > len(b.flat) or reaches.get(literal[-MIN_LITERAL:], len(literal)) < len(literal)]


def _wrapped(matcher: Matcher, lines: list[Line]) -> Iterator[tuple[Entry, str]]:
    """Entries whose match begins on the first of these lines and ends on the last, each break
    rejoined with a space (a wrap at a word boundary) or with nothing (a hard wrap inside a word).

    Most windows hold no catalog text at all, so the regexes run only on the patterns that can
    match: those whose literal is inside one of the lines (`Line.found`), and those whose literal
    may run across a break (`Line.tails`) and does in this rejoining."""
    crossing = [tail for x in lines[:-1] for tail in x.tails]
    inside = set().union(*(x.found for x in lines))
    if not crossing and not inside:
        return
    parts = [lines[0].text.rstrip(), *(x.text.strip() for x in lines[1:-1]), lines[-1].text.lstrip()]
    flats = [x.flat for x in lines]
    found: set[str] = set()
    for seps in product((" ", ""), repeat=len(parts) - 1):
        flat = flats[0] + "".join(sep + part for sep, part in zip(seps, flats[1:]))
        only = sorted(inside.union(index for literal, index in crossing if literal in flat))
        if not only:
            continue
        joined = parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:]))
        first_end, last_start = len(parts[0]), len(joined) - len(parts[-1])
        for entry, start, end in matcher.spans(joined, only=only):
            if start < first_end and end > last_start and entry.code not in found:
                found.add(entry.code)
                yield entry, joined


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
