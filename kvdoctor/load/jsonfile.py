"""Bounded, strict reading of input files, and JSON with the line of every key.

Every file kvdoctor reads goes through `read_bounded` (or `open_regular`): only regular files are
read (a FIFO or a device would block or never end), opened without following the path twice, and
refused past a size bound before a byte is read. `require_inside` keeps symlinks from leading out
of the model directory. JSON is parsed strictly so findings can point at `config.json:LINE`.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from itertools import compress
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from kvdoctor.errors import InputError
from kvdoctor.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH

MAX_INT_DIGITS = 30
_CONTAINERS = (dict, list)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:\n]')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def show(value: Any, width: int = 40) -> str:
    """A value for an error message: its repr, cut to `width` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def is_utf8(text: str) -> bool:
    """False for text holding lone surrogates: a file name that was not UTF-8 on disk, or an escape
    such as "\\ud800" in JSON."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def open_regular(path: Path, what: str) -> tuple[BinaryIO, int]:
    """Open a regular file for reading: (file, size). Anything else is an InputError.

    The file is opened first and checked after (fstat), so a path swapped between the check and
    the open cannot slip through; O_NONBLOCK keeps a FIFO from blocking the open.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise InputError(f"{path}: {what} must be a regular file, found a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InputError(f"{path}: {what} must be a regular file, found {_kind(info.st_mode)}")
    return os.fdopen(fd, "rb"), info.st_size


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "something else"


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """Read a small regular file whole, refusing one over `limit` bytes before reading it."""
    fh, size = open_regular(path, what)
    with fh:
        if size > limit:
            raise InputError(f"{path}: {what} is {size} bytes, more than the {limit}-byte limit")
        try:
            data = fh.read(size + 1)  # a buffer of the file's size: `limit` bytes would cost an allocation
            if len(data) > size:  # grown since fstat: read on to the bound
                data += fh.read(limit + 1 - len(data))
        except OSError as exc:
            raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:  # grew since fstat
        raise InputError(f"{path}: {what} is more than the {limit}-byte limit")
    return data


def require_inside(path: Path, root: Path, what: str) -> None:
    """Refuse a path whose symlinks lead outside `root` (or loop, or dangle)."""
    if path.parent == root:  # directly in root: inside unless it is a symlink (one lstat, no resolving)
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return
        except OSError:
            pass  # missing: resolving says so
    try:
        real = path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a symlink loop this way
        raise InputError(f"{path}: {what} is a symlink loop") from None
    except FileNotFoundError:
        raise InputError(f"{path}: {what} is missing or a broken symlink") from None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP
            raise InputError(f"{path}: {what} is a symlink loop") from None
        raise InputError(f"{path}: cannot resolve {what}: {exc.strerror or exc}") from None
    try:
        real.relative_to(root.resolve())
    except ValueError:
        raise InputError(f"{path}: {what} resolves to {real}, outside {root}; "
                         "expected files inside the model directory") from None


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer {show(text, 24)} has {len(text.lstrip('-'))} digits; "
                         f"at most {MAX_INT_DIGITS} are accepted")
    return int(text)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {show(key)} appears twice in one object; expected each key once")
    return value


def reject_constant(name: str) -> Any:
    """For safetensors headers, which the safetensors library parses as strict JSON."""
    raise ValueError(f"{name} is not valid JSON")


def non_finite(value: Any, path: str = "") -> list[tuple[str, float]]:
    """(dotted key path, value) of every NaN or infinite number in a parsed JSON value. Python's json
    (and so transformers) reads `NaN`, `Infinity`, `-Infinity` and overflowing numbers such as 1e999
    as non-finite floats; a rule decides where one matters."""
    found: list[tuple[str, float]] = []
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            found.append((where, item))
        elif isinstance(item, dict):
            stack.extend((f"{where}.{k}" if where else k, v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((where, v) for v in item)
    return sorted(found, key=lambda f: f[0])


def load_json(path: Path, what: str = "JSON", with_lines: bool = True) -> tuple[Any, dict[str, int]]:
    """Parse a JSON file strictly: bounded size and depth, no duplicate keys; the non-finite numbers
    Python's json accepts (NaN, Infinity, -Infinity, 1e999) are read as it reads them. Returns the value
    and a map from dotted key path (`text_config.sliding_window`) to its line; with `with_lines=False` (a
    large index nobody points into) the map is empty and the same checks run on the parsed value instead of a character scan."""
    data = read_bounded(path, MAX_JSON_BYTES, what)
    if not with_lines:
        plain = _plain_value(data)
        if plain is not None:
            return plain[0], {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {what} is not UTF-8 (byte offset {exc.start})") from None
    try:
        value = json.loads(text, parse_int=_bounded_int, object_pairs_hook=None if with_lines else _unique_pairs)
    except RecursionError:
        raise InputError(f"{path}: {what} nests too deeply; at most {MAX_JSON_DEPTH} levels are accepted") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: {what} is not valid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise InputError(f"{path}: {what} is not valid JSON: {exc}") from None
    if not with_lines:
        # The bracket count bounds the depth, and an unpaired surrogate needs a \\uD8.. escape in the
        # text: a large index (20k names) skips the walk over its strings when neither can be a problem.
        if text.count("{") + text.count("[") > MAX_JSON_DEPTH or "\\ud" in text.lower():
            _check_value(value, path, what)
        return value, {}
    lines, depth, duplicate, surrogate = _scan(text)
    if depth > MAX_JSON_DEPTH:
        raise InputError(f"{path}: {what} nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted")
    if duplicate:
        key, line = duplicate
        raise InputError(f"{path}:{line}: key {show(key)} appears twice in one object; expected each key once")
    if surrogate:
        raise InputError(f"{path}:{surrogate}: {what} has a string with an unpaired \\uD800-\\uDFFF escape; "
                         "expected valid Unicode")
    return value, lines


def _plain_value(data: bytes) -> tuple[Any] | None:
    """(value,) of JSON text that every check of `load_json` passes, decoded by msgspec (a large index
    in a few milliseconds), or None to let the careful path decide and say why.

    The text must hold no backslash, so that it spells no escape (no surrogate, no key two ways) and
    every string is the raw text between two quotes; its quotes then number twice the strings the
    value holds exactly when no object gives a key twice (a repeated key keeps one value). msgspec
    refuses NaN and Infinity, which the careful path reads as Python's json does."""
    if b"\\" in data:
        return None
    try:
        value = msgspec.json.decode(data)
    except (msgspec.MsgspecError, RecursionError):  # deep nesting: the careful path says so
        return None
    strings = _strings_within_bounds(value)
    if strings is None or data.count(b'"') != 2 * strings:
        return None
    return (value,)


def _strings_within_bounds(value: Any) -> int | None:
    """The keys and string values of a decoded value, or None past the depth or integer bounds. One
    level of containers at a time, each counted by C-level map and count."""
    if type(value) not in _CONTAINERS:
        return None if type(value) is int and len(str(abs(value))) > MAX_INT_DIGITS else int(type(value) is str)
    level, strings, depth = [value], 0, 1
    while level:
        if depth >= MAX_JSON_DEPTH:
            return None
        below: list[Any] = []
        for item in level:
            if type(item) is dict:
                strings += len(item)
                item = item.values()
            types = list(map(type, item))
            strings += types.count(str)
            if int in types and any(len(str(abs(v))) > MAX_INT_DIGITS for v in item if type(v) is int):
                return None
            if dict in types or list in types:
                below.extend(compress(item, map(_CONTAINERS.__contains__, types)))
        level, depth = below, depth + 1
    return strings


def _check_value(value: Any, path: Path, what: str) -> None:
    """Depth, duplicate keys and unpaired surrogates, checked on a parsed value (no line numbers)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InputError(f"{path}: {what} nests more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(item, dict):
            for key, child in item.items():
                if not is_utf8(key):
                    raise InputError(f"{path}: {what} has a key with an unpaired \\uD800-\\uDFFF escape; "
                                     "expected valid Unicode")
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and not is_utf8(item):
            raise InputError(f"{path}: {what} has a string with an unpaired \\uD800-\\uDFFF escape; "
                             "expected valid Unicode")


def _scan(text: str) -> tuple[dict[str, int], int, tuple[str, int] | None, int | None]:
    """One pass over valid JSON text: (key lines, deepest nesting, first duplicate key and its line,
    line of the first string that escapes half a UTF-16 surrogate pair, which no file name, tensor
    name or report can carry).

    Key lines map each object key's dotted path to the 1-based line it sits on. Array elements are
    not numbered: a key inside an array of objects is recorded under the array's own path, which
    is where a reader would look.
    """
    lines: dict[str, int] = {}
    surrogate: int | None = None
    stack: list[tuple[str, str, set[str]]] = []  # (bracket, path of the container, keys seen in it)
    pending_key: str | None = None
    previous = ""
    duplicate: tuple[str, int] | None = None
    line = 1
    deepest = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
            continue
        if surrogate is None and token.startswith('"') and _SURROGATE_ESCAPE.search(token):
            if not is_utf8(json.loads(token)):
                surrogate = line
        if token == ":" and stack and stack[-1][0] == "{" and previous.startswith('"'):
            key = json.loads(previous)
            _, parent, seen = stack[-1]
            if key in seen and duplicate is None:
                duplicate = (f"{parent}.{key}" if parent else key, line)
            seen.add(key)
            pending_key = f"{parent}.{key}" if parent else key
            lines.setdefault(pending_key, line)
        elif token in "{[":
            path = stack[-1][1] if stack and stack[-1][0] == "[" else (pending_key or "")
            stack.append((token, path, set()))
            deepest = max(deepest, len(stack))
            pending_key = None
        elif token in "}]":
            stack.pop()
        previous = token
    return lines, deepest, duplicate, surrogate
