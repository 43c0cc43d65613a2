"""Strict JSON reading with the line of every key, so findings can point at `config.json:LINE`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvdoctor.errors import InputError

MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """Read a small file whole, refusing one over `limit` bytes before reading it."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise InputError(f"{path}: {what} is {size} bytes, more than the {limit}-byte limit")
        with path.open("rb") as fh:
            return fh.read(limit + 1)
    except InputError:
        raise
    except IsADirectoryError:
        raise InputError(f"{path}: expected a {what} file, found a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def load_json(path: Path, what: str = "JSON") -> tuple[Any, dict[str, int]]:
    """Parse a JSON file strictly (no NaN/Infinity, bounded size and depth).

    Returns the value and a map from dotted key path (`text_config.sliding_window`) to its line.
    """
    data = read_bounded(path, MAX_JSON_BYTES, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {what} is not UTF-8 (byte offset {exc.start})") from None
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        raise InputError(f"{path}: {what} nests {depth} levels deep; at most {MAX_DEPTH} are accepted")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: {what} is not valid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise InputError(f"{path}: {what} is not valid JSON: {exc}") from None
    return value, key_lines(text)


def _max_depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def key_lines(text: str) -> dict[str, int]:
    """Map each object key's dotted path to the 1-based line it sits on (first occurrence wins).

    Array elements are not numbered: a key inside an array of objects is recorded under the
    array's own path, which is where a reader would look.
    """
    lines: dict[str, int] = {}
    stack: list[tuple[str, str]] = []  # (container type, path of the container)
    pending_key: str | None = None
    line = 1
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
        elif ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            raw = text[i : j + 1]
            k = j + 1
            while k < n and text[k] in " \t\r\n":
                k += 1
            if stack and stack[-1][0] == "{" and k < n and text[k] == ":":
                try:
                    key = json.loads(raw)
                except ValueError:
                    key = raw.strip('"')
                parent = stack[-1][1]
                pending_key = f"{parent}.{key}" if parent else key
                lines.setdefault(pending_key, line)
            line += raw.count("\n")
            i = j
        elif ch in "{[":
            if stack and stack[-1][0] == "[":
                path = stack[-1][1]
            else:
                path = pending_key or ""
            stack.append((ch, path))
            pending_key = None
        elif ch in "}]":
            if stack:
                stack.pop()
        i += 1
    return lines
