"""Bounded, strict YAML for deploy files, KDA recipes and catalog entries.

Plain data only, read the YAML 1.2 way: `yes`, `on` and `2024-01-01` are strings, only
`true`/`false` are booleans, `0o17` is octal and `017` is seventeen. A tag of any kind (`!!python/...`,
`!!binary`, `!custom`) is refused, not resolved. Before anything is built, the parse events bound the
nesting depth, and the node graph is walked once with every alias expanded, so a YAML "billion
laughs" is refused instead of expanded. A key given twice in one mapping is refused rather than
silently overwritten, also when it is spelled two ways (`1` and `0x1`), and so is text that is not
Unicode. Every error is one line with the file, the line and the key path.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from kvdoctor.errors import InputError
from kvdoctor.load.jsonfile import is_utf8, read_bounded, show
from kvdoctor.limits import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES

MAX_INT_DIGITS = 30


class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # libyaml's parser where PyYAML has it
    """The safe loader with YAML 1.2's core schema instead of YAML 1.1's implicit types."""

    yaml_implicit_resolvers: dict = {}


def _int(loader: Loader, node: yaml.ScalarNode) -> int:
    text = node.value.lstrip("+")
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(None, None, f"integer with {len(digits)} digits; at most "
                                                f"{MAX_INT_DIGITS} are accepted", node.start_mark)
    if digits[:2] in ("0o", "0x"):
        return int(digits[2:], 8 if digits[1] == "o" else 16)
    return int(text)


_CORE_SCHEMA = [
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$"),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    ("tag:yaml.org,2002:float", (r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                 r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")),
]
for _tag, _pattern in _CORE_SCHEMA:
    Loader.add_implicit_resolver(_tag, re.compile(_pattern), None)
Loader.add_constructor("tag:yaml.org,2002:int", _int)


def load_yaml(path: Path, what: str, limit: int = MAX_YAML_BYTES) -> tuple[Any, dict[str, int]]:
    """(data, {dotted key: line}) of a YAML file; None for an empty one. InputError on anything else."""
    data = read_bounded(path, limit, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {what} is not UTF-8 (byte offset {exc.start})") from None
    try:
        _check_events(text, path, what)
        loader = Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, {}
            lines = _walk(node, loader, path, what)
            value = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{where}: {what} is not valid YAML: {problem}") from None
    except RecursionError:
        raise InputError(f"{path}: {what} nests too deeply; at most {MAX_YAML_DEPTH} levels are accepted") from None
    return value, lines


def _check_events(text: str, path: Path, what: str) -> None:
    """Refuse tags and nesting past the bound, from the parse events (nothing is built yet)."""
    stack: list[list] = []  # per open collection: [is mapping, its key path, next is a key, last key]
    for event in yaml.parse(text, Loader=Loader):
        if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent, yaml.AliasEvent)):
            where = ""
            if stack:
                top = stack[-1]
                where = top[1]
                if top[0] and not top[2]:
                    where = f"{top[1]}.{top[3]}" if top[1] else str(top[3])
                if top[0]:
                    if top[2] and isinstance(event, yaml.ScalarEvent):
                        top[3] = event.value
                    top[2] = not top[2]
            if getattr(event, "tag", None) is not None:
                at = f" at {show(where)}" if where else ""
                raise InputError(f"{path}:{event.start_mark.line + 1}: {what} has the tag {show(event.tag)}{at}; "
                                 "tags are not accepted, write plain values")
            if isinstance(event, yaml.CollectionStartEvent):
                stack.append([isinstance(event, yaml.MappingStartEvent), where, True, None])
                if len(stack) > MAX_YAML_DEPTH:
                    raise InputError(f"{path}:{event.start_mark.line + 1}: {what} nests more than "
                                     f"{MAX_YAML_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            stack.pop()


def _walk(root: yaml.Node, loader: Loader, path: Path, what: str) -> dict[str, int]:
    """Count every node with aliases expanded (refusing past the bound), refuse duplicate keys (by
    the value they spell, as the mapping would store them), and record the line of each mapping key
    under its dotted path."""
    lines: dict[str, int] = {}
    stack: list[tuple[yaml.Node, str, int]] = [(root, "", 1)]
    visited = 0
    while stack:
        node, prefix, depth = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise InputError(f"{path}: {what} expands to more than {MAX_YAML_NODES} values (through aliases); "
                             "expected a small settings file")
        if depth > MAX_YAML_DEPTH and isinstance(node, yaml.CollectionNode):  # only through aliases: the
            # parse events bounded the written nesting already
            raise InputError(f"{path}:{node.start_mark.line + 1}: {what} nests more than {MAX_YAML_DEPTH} levels "
                             "deep through aliases (an alias inside its own anchor?)")
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else show(key_node.value)
                dotted = f"{prefix}{key}"
                same = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else key
                if same in seen:
                    raise InputError(f"{path}:{key_node.start_mark.line + 1}: {what} sets {show(dotted, 80)} twice; "
                                     "expected each key once")
                seen.add(same)
                lines.setdefault(dotted, key_node.start_mark.line + 1)
                stack.append((value_node, dotted + ".", depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, prefix, depth + 1) for item in node.value)
        elif not is_utf8(node.value):
            raise InputError(f"{path}:{node.start_mark.line + 1}: {what} has a string with an unpaired UTF-16 "
                             "surrogate; expected valid Unicode")
    return lines


def load_validated(path: Path, schema: Any, what: str, limit: int, field_word: str = "field",
                   empty: bool = False) -> tuple[Any, dict[str, int]]:
    """A YAML mapping validated by a pydantic model: (instance, key lines). The first validation error
    becomes one line naming the file, the line of the offending key when it has one, and the field."""
    from pydantic import ValidationError

    data, lines = load_yaml(path, what, limit)
    if data is None and empty:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: {what} must be a YAML mapping")
    try:
        value = schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        keys = [str(p) for p in err["loc"] if p != "[key]"]
        if err["type"] == "missing" or not _located(data, keys):
            keys = keys[:-1] if err["type"] != "missing" and _located(data, keys[:-1]) else keys
        field = ".".join(keys) or "(top level)"
        line = next((lines[k] for k in (".".join(keys[:n]) for n in range(len(keys), 0, -1)) if k in lines), None)
        where = f"{path}:{line}" if line else str(path)
        raise InputError(f"{where}: {field_word} {field!r}: {error_detail(err)}") from None
    return value, lines


def error_detail(err: Any) -> str:
    """A pydantic error's message, with the offending value where the message does not show it."""
    msg = str(err["msg"]).removeprefix("Value error, ")
    shown = _plain(err.get("input"))
    got = "" if err["type"] in ("missing", "extra_forbidden") or shown in msg else f" (got {shown})"
    return msg + got


def _located(data: Any, keys: list[str]) -> bool:
    """Whether `keys` is a path into `data` (pydantic adds the name of a union member to its errors)."""
    for key in keys:
        if isinstance(data, dict) and any(str(k) == key for k in data):
            data = next(v for k, v in data.items() if str(k) == key)
        elif isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        else:
            return False
    return True


def _plain(value: Any) -> str:
    """A value as it is written in YAML, for an error message."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return show(value)

