"""Bounded, safe YAML for deploy files and catalog entries.

The safe loader builds plain data only: a tag that would construct an object is refused. Before
anything is built, the parse events bound the nesting depth, and the node graph is walked once with
every alias expanded, so a YAML "billion laughs" is refused instead of expanded. A key given twice
in one mapping is refused rather than silently overwritten, and so is text that is not Unicode.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kvdoctor.errors import InputError
from kvdoctor.jsonfile import is_utf8, read_bounded, show
from kvdoctor.limits import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES

# libyaml's parser when PyYAML was built with it (the wheels are): same safe constructors, ~10x faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path, what: str, limit: int = MAX_YAML_BYTES) -> tuple[Any, dict[str, int]]:
    """(data, {dotted key: line}) of a YAML file; None for an empty one. InputError on anything else."""
    data = read_bounded(path, limit, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {what} is not UTF-8 (byte offset {exc.start})") from None
    try:
        _check_depth(text, path, what)
        loader = SAFE_LOADER(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, {}
            lines = _walk(node, path, what)
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


def _check_depth(text: str, path: Path, what: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=SAFE_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise InputError(f"{path}:{event.start_mark.line + 1}: {what} nests more than {MAX_YAML_DEPTH} "
                                 "levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _walk(root: yaml.Node, path: Path, what: str) -> dict[str, int]:
    """Count every node with aliases expanded (refusing past the bound), refuse duplicate keys, and
    record the line of each mapping key under its dotted path."""
    lines: dict[str, int] = {}
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    visited = 0
    while stack:
        node, prefix = stack.pop()
        visited += 1
        if visited > MAX_YAML_NODES:
            raise InputError(f"{path}: {what} expands to more than {MAX_YAML_NODES} values (through aliases); "
                             "expected a small settings file")
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else show(key_node.value)
                dotted = f"{prefix}{key}"
                if key in seen:
                    raise InputError(f"{path}:{key_node.start_mark.line + 1}: {what} sets {show(dotted)} twice; "
                                     "expected each key once")
                seen.add(key)
                lines.setdefault(dotted, key_node.start_mark.line + 1)
                stack.append((value_node, dotted + "."))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, prefix) for item in node.value)
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
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        where = f"{path}:{lines[field]}" if field in lines else str(path)
        raise InputError(f"{where}: {field_word} {field!r}: {err['msg']}") from None
    return value, lines

