"""A plain `kvdoctor check` command line, read without typer.

typer and click take longer to import and to build their command tree than a static check of a
20k-tensor checkpoint takes to parse its headers, and a fleet, a CI gate or a pre-deploy hook pays
that on every run. So `cli.main` first asks `read_check` for the line: it reads only what it can read
exactly as typer would (the option spellings below, each value as the command's type accepts it
unchanged) and returns None for anything else, which typer then reads and, where it is wrong,
reports. The table is typer's options of `check` transcribed; tests/test_argv.py holds it to the
typer command, spelling by spelling, and compares what both readings give on many command lines.
"""
from __future__ import annotations

import msgspec

from kvdoctor.cli.check import CheckRequest
from kvdoctor.limits import PLAIN_INT_RANGES

FLAG, VALUE, VALUES = "flag", "value", "values"
# What a value may be for the fast reading: any text, a strict.Name (printable, not blank), a plain
# decimal --jobs; None: a type only strict.py (pydantic) reads, so the line goes to typer.
TEXT, NAME, JOBS = "text", "name", "jobs"

# (spellings, parameter, kind, value type), in the order of commands.check's parameters.
CHECK_OPTIONS: tuple[tuple[tuple[str, ...], str, str, str | None], ...] = (
    (("--engine", "-e"), "engine", VALUE, TEXT),
    (("--deploy",), "deploy", VALUE, NAME),
    (("--format", "--output-format"), "output_format", VALUE, TEXT),
    (("--output-file", "-o"), "output_file", VALUE, TEXT),
    (("--json-output",), "json_output", VALUE, TEXT),
    (("--sarif-output",), "sarif_output", VALUE, TEXT),
    (("--junit-output",), "junit_output", VALUE, TEXT),
    (("--gitlab-output",), "gitlab_output", VALUE, TEXT),
    (("--html-output",), "html_output", VALUE, NAME),
    (("--kv-budget",), "kv_budget", VALUE, None),
    (("--statistics",), "statistics", FLAG, None),
    (("--select",), "select", VALUES, TEXT),
    (("--extend-select",), "extend_select", VALUES, TEXT),
    (("--ignore",), "ignore", VALUES, TEXT),
    (("--severity",), "severity", VALUES, TEXT),
    (("--fail-on",), "fail_on", VALUE, TEXT),
    (("--exit-zero",), "exit_zero", FLAG, None),
    (("--static",), "static", FLAG, None),
    (("--dry-run",), "dry_run", FLAG, None),
    (("--trust-remote-code",), "trust_remote_code", FLAG, None),
    (("--dry-run-timeout",), "dry_run_timeout", VALUE, None),
    (("--engine-python",), "engine_python", VALUE, NAME),
    (("--dry-run-budget",), "dry_run_budget", VALUE, None),
    (("--baseline",), "baseline", VALUE, NAME),
    (("--write-baseline",), "write_baseline", VALUE, NAME),
    (("--jobs", "-j"), "jobs", VALUE, JOBS),
    (("--quiet", "-q"), "quiet", FLAG, None),
    (("--shard",), "shard", VALUE, TEXT),
    (("--executor",), "executor", VALUE, TEXT),
    (("--ray-address",), "ray_address", VALUE, TEXT),
    (("--config",), "config", VALUE, NAME),
    (("--isolated",), "isolated", FLAG, None),
)
TARGETS_TYPE = NAME
# The options before the command: --version and --help are typer's to answer.
ROOT_OPTIONS: tuple[tuple[tuple[str, ...], str, str, str | None], ...] = (
    (("--debug",), "debug", FLAG, None),
    (("--catalog",), "catalog_dirs", VALUES, NAME),
)

_CHECK = {spelling: row for row in CHECK_OPTIONS for spelling in row[0]}
_ROOT = {spelling: row for row in ROOT_OPTIONS for spelling in row[0]}


class CheckLine(msgspec.Struct):
    root: dict  # debug, catalog_dirs: for check_command.RUN
    request: CheckRequest


class _NotPlain(Exception):
    """The line holds something only typer reads exactly."""


def read_check(args: list[str]) -> CheckLine | None:
    """The request of a plain `check` line, or None to let typer read the line."""
    try:
        root, rest = _read(args, _ROOT, stop_at_command=True)
        if not rest or rest[0] != "check":
            return None
        values, targets = _read(rest[1:], _CHECK, stop_at_command=False)
        values["targets"] = [_value(t, TARGETS_TYPE) for t in targets] or None
    except _NotPlain:
        return None
    return CheckLine(root={"debug": root.get("debug", False), "catalog_dirs": tuple(root.get("catalog_dirs", ()))},
                     request=CheckRequest(**values))


def _read(args: list[str], table: dict, stop_at_command: bool) -> tuple[dict, list[str]]:
    """(parameter -> value, the other tokens); options and arguments may come in any order, and
    `--` ends the options. With `stop_at_command` the first argument ends the reading."""
    values: dict = {}
    others: list[str] = []
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            others.extend(tokens)
            break
        if token == "-":  # standard input, as click reads it
            raise _NotPlain
        if not token.startswith("-"):
            others.append(token)
            if stop_at_command:
                others.extend(tokens)
                break
            continue
        spelling, equals, attached = token.partition("=")
        if spelling not in table or (equals and not spelling.startswith("--")):
            raise _NotPlain  # unknown, or typer's to refuse (`-j2`, `-qj 2`, `-e=x`)
        _, parameter, kind, value_type = table[spelling]
        if kind == FLAG:
            if equals or parameter in values:
                raise _NotPlain
            values[parameter] = True
            continue
        value = attached if equals else next(tokens, None)
        if value is None or (not equals and value.startswith("-")) or value_type is None:
            raise _NotPlain
        if kind == VALUES:
            values.setdefault(parameter, []).append(_value(value, value_type))
        elif parameter in values:
            raise _NotPlain
        else:
            values[parameter] = _value(value, value_type)
    return values, others


def _value(text: str, value_type: str | None):
    """The value as the command's type gives it, where that type would pass it unchanged."""
    if value_type == TEXT:
        return text
    if value_type == NAME and text.strip() and text.isprintable():
        return text
    if value_type == JOBS and text.isascii() and text.isdigit() and text[0] != "0":
        low, high = PLAIN_INT_RANGES["Jobs"]
        if low <= int(text) <= high:
            return int(text)
    raise _NotPlain
