"""List the runtime messages of an engine's source tree that no catalog entry names yet.

    python tools/harvest_messages.py ROOT GLOB [GLOB ...] [--all | --bare | --statements VERSION]

ROOT is an unpacked release (a wheel or sdist: the folder holding `vllm/`, `sglang/`, `mlx_lm/` or
`transformers/`); each GLOB picks files under it (`'vllm/v1/core/**/*.py'`). Every `raise X("...")`,
`assert ..., "..."` and `logger.error/warning/critical("...")` whose message is about KV caches, blocks,
pools, tokens, memory or state caches is rendered as the engine prints it (an f-string's fields as
`{expression}`), and matched against the catalog with each field filled by "7", as `triage` would read
it. One line per message no entry names (`--all`: every message, with the codes that name it):

    path:line  Class  message

This is how round 3 of issue 43 found what to add; the entries carry the messages verbatim.

`--bare` lists instead the functions whose bare asserts (no message) are all one statement, which a
traceback ending in a bare AssertionError can name by its frame alone, less those an entry already
lists in its `functions`:

    path:line  in function  assert statement

`--statements VERSION` (ROOT being that release) lists, for the first source line of each raise and
assert in a function (the line a traceback prints at its frame), the catalog codes of the statements
beginning with it: by message (a message held in a variable is read through its assignment), by a
quoted bare assert, or by an entry's site at VERSION inside the statement; `?` for one no entry
names. A line with one code names that entry from a traceback cut at its frame (`error.statements`):

    CODE|?[,...]  path in function: source line
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Iterator

from kvdoctor.catalog import builtin_catalog
from kvdoctor.catalog.matcher import Matcher

TOPIC = re.compile(r"kv|cache|block|pool|token|memory|slot|page|state|alloc|free|leak|mamba|swa|window|evict|"
                   r"radix|req_to|out of", re.IGNORECASE)
MIN_MESSAGE = 20
LOG_METHODS = ("error", "warning", "critical")
FIELD = re.compile(r"\{[^{}]*\}")


def text_of(node: ast.expr) -> str | None:
    """A message expression as the engine prints it, fields kept as `{expression}`; None if it is not
    a string built from literals (a variable, a call other than str.format)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"  # type: ignore[attr-defined]
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = text_of(node.left), text_of(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):  # "... %s" % args
        return text_of(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return text_of(node.func.value)
    return None


def messages(path: Path) -> list[tuple[int, str, str]]:
    """(line, class, message) of each raise, assert and logged error in one file."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            found.append((node.lineno, ast.unparse(node.exc.func), text_of(node.exc.args[0])))
        elif isinstance(node, ast.Assert) and node.msg is not None:
            found.append((node.lineno, "AssertionError", text_of(node.msg)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in LOG_METHODS and node.args):
            found.append((node.lineno, f"log.{node.func.attr}", text_of(node.args[0])))
    return [(line, cls, text) for line, cls, text in found
            if text is not None and len(text) >= MIN_MESSAGE and TOPIC.search(text)]


def lone_bare_asserts(path: Path) -> list[tuple[int, str, str]]:
    """(line, function, statement) for each function of a file whose bare asserts are all one statement."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return []
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inner = {id(n) for f in ast.walk(function) if f is not function
                 and isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for n in ast.walk(f)}
        bare = [n for n in ast.walk(function) if isinstance(n, ast.Assert) and n.msg is None and id(n) not in inner]
        statements = {ast.unparse(n) for n in bare}
        if len(statements) == 1:
            found.append((bare[0].lineno, function.name, statements.pop()))
    return sorted(found)


MIN_STATEMENT_LINE = 12  # a shorter source line (`)`, `assert (`) says too little to name a raise by


def _functions(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, list[ast.stmt]]]:
    """Each function with the raise and assert statements of its own body (not of nested functions)."""
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = {id(n) for f in ast.walk(function) if f is not function
                     and isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for n in ast.walk(f)}
            yield function, [n for n in ast.walk(function)
                             if isinstance(n, (ast.Raise, ast.Assert)) and id(n) not in inner]


def _message_of(node: ast.stmt, assigned: dict[str, list[str]]) -> list[str]:
    """The texts a raise or assert may print: its literal message, or those assigned to the name it raises."""
    arg = node.msg if isinstance(node, ast.Assert) else (
        node.exc.args[0] if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args else None)
    if arg is None:
        return []
    if isinstance(arg, ast.Name):
        return assigned.get(arg.id, [])
    text = text_of(arg)
    return [text] if text is not None else []


def statement_codes(path: Path, relative: str, version: str, catalog, matcher: Matcher) -> dict[tuple[str, str], set[str]]:
    """(function, source line) -> the codes of every raise and assert of that function showing that line."""
    try:
        source = path.read_text(errors="replace")
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    lines = source.splitlines()
    sites = {(e.code, int(m.group(2))) for e in catalog.entries.values() if e.error is not None
             for s in [e.error.source, *e.error.sites] if s.endswith(f" @ {version}")
             for m in [re.match(r"(?:python/)?([\w./-]+\.py):(\d+)", s)] if m and relative.endswith(m.group(1))}
    name = relative.rsplit("/", 1)[-1]
    quoted = {e.error.message.strip(): e.code for e in catalog.entries.values() if e.error is not None
              and e.error.message.startswith("assert ")  # a bare `raise X()` is too common to be one entry's
              and any(s.split(":")[0].rsplit("/", 1)[-1] == name for s in [e.error.source, *e.error.sites])}
    found: dict[tuple[str, str], set[str]] = {}
    for function, nodes in _functions(tree):
        assigned: dict[str, list[str]] = {}
        for n in ast.walk(function):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                if (text := text_of(n.value)) is not None:
                    assigned.setdefault(n.targets[0].id, []).append(text)
        for node in nodes:
            end = node.end_lineno or node.lineno
            codes = {code for code, line in sites if node.lineno <= line <= end}
            codes |= {quoted[s] for s in [ast.unparse(node)] if s in quoted}
            for text in _message_of(node, assigned):
                codes |= {entry.code for entry, _, _ in matcher.spans(FIELD.sub("7", text))}
            shown = lines[node.lineno - 1].strip()  # the line a traceback prints for this frame
            if len(shown) >= MIN_STATEMENT_LINE:
                found.setdefault((function.name, shown), set()).update(codes or {"?"})
    return found


def main(argv: list[str]) -> int:
    show_all, show_bare = "--all" in argv, "--bare" in argv
    version = argv[argv.index("--statements") + 1] if "--statements" in argv[:-1] else None
    args = [a for a in argv if a not in ("--all", "--bare", "--statements", version)]
    if len(args) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root, globs = Path(args[0]), args[1:]
    catalog = builtin_catalog()
    files = sorted({p for g in globs for p in root.glob(g) if p.is_file()})
    if show_bare:
        listed = {(f.split(" in ")[0].rsplit("/", 1)[-1], f.split(" in ")[1])
                  for e in catalog.entries.values() if e.error is not None for f in e.error.functions}
        for path in files:
            for line, function, statement in lone_bare_asserts(path):
                if (path.name, function) not in listed:
                    print(f"{path.relative_to(root)}:{line}  in {function}  {statement}")
        return 0
    matcher = Matcher(catalog)
    if version is not None:
        for path in files:
            relative = str(path.relative_to(root))
            for (function, shown), codes in sorted(statement_codes(path, relative, version, catalog, matcher).items()):
                print(f"{','.join(sorted(codes))}  {relative} in {function}: {shown}")
        return 0
    for path in files:
        for line, cls, text in messages(path):
            codes = sorted({entry.code for entry, _, _ in matcher.spans(FIELD.sub("7", text))})
            if show_all or not codes:
                named = f"  [{', '.join(codes)}]" if codes else ""
                print(f"{path.relative_to(root)}:{line}  {cls}  {text!r}{named}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
