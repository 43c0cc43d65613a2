"""argv.py reads a plain `check` line exactly as typer does, or leaves it to typer.

The table is held to typer's command spelling by spelling; then many command lines are read both
ways: through argv.read_check, and through the typer application with run_check replaced by a
function that keeps the request it is given (the request is what both readings hand over)."""
from __future__ import annotations

import pytest
import typer.main
from hypothesis import given, settings, strategies as st

from kvdoctor.cli import argv
from kvdoctor.cli import check as check_command
from kvdoctor.cli import app as commands
from kvdoctor.cli.check import CheckRequest


def _check_command():
    return typer.main.get_command(commands.app).commands["check"]


def test_the_table_names_every_option_of_the_typer_command_as_typer_defines_it():
    options = [p for p in _check_command().params if p.param_type_name == "option"]
    assert [p.name for p in options] == [row[1] for row in argv.CHECK_OPTIONS]
    for param, (spellings, name, kind, value_type) in zip(options, argv.CHECK_OPTIONS):
        assert tuple(param.opts) == spellings and not param.secondary_opts, name
        assert kind == (argv.FLAG if param.is_flag else argv.VALUES if param.multiple else argv.VALUE), name
        assert param.envvar is None and param.nargs == 1, name
        assert getattr(CheckRequest(), name) == (None if param.multiple else param.default), name
        # a value type the fast reading passes through is one typer's type passes through unchanged
        expected = {"STR": argv.TEXT, "TEXT": argv.TEXT, "PATH": argv.NAME, "INTEGER": argv.JOBS}.get(param.type.name.upper())
        assert value_type in (None, expected), name
    (targets,) = [p for p in _check_command().params if p.param_type_name == "argument"]
    assert targets.name == "targets" and targets.nargs == -1 and targets.type.name == "TARGET"
    root = {p.name: p for p in typer.main.get_command(commands.app).params}
    assert tuple(root["debug"].opts) == ("--debug",) and root["debug"].is_flag
    assert tuple(root["catalog"].opts) == ("--catalog",) and root["catalog"].multiple


def _typer_reading(args: list[str]):
    """What the typer application hands run_check for `args`, and the root options it set; or the
    error line it gives."""
    kept = []
    saved = dict(check_command.RUN)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(commands, "run_check", lambda request: kept.append(request) or 0)
        try:
            commands.run(args)
        except Exception as exc:  # noqa: BLE001 - the usage error is the reading
            return f"error: {exc}"
        finally:
            root = dict(check_command.RUN)
            check_command.RUN.update(saved)
    return (root, kept[0]) if kept else "no request"


def _agree(args: list[str]) -> bool:
    """Whether argv.py read `args` (it must then agree with typer); True also when it left the line
    to typer."""
    line = argv.read_check(args)
    if line is None:
        return False
    assert _typer_reading(args) == (line.root, line.request), args
    return True


@pytest.mark.parametrize("args", [
    ["check"],  # the config file's targets
    ["check", "m"],
    ["check", "a", "b", "--static", "--format", "json", "-j", "2"],
    ["check", "--static", "a", "--format=sarif", "-q", "b"],
    ["--debug", "check", "m", "--engine", "vllm", "--deploy", "d.yaml"],
    ["--catalog", "extra", "--catalog=more", "check", "m", "-e", "sglang-mlx", "--dry-run"],
    ["check", "m", "--select", "CFG,SWA", "--select", "CKPT", "--ignore", "X1", "--severity", "CFG001=info"],
    ["check", "m", "--extend-select", "VLM", "--fail-on", "warning", "--exit-zero", "--statistics"],
    ["check", "m", "--json-output", "a.json", "--sarif-output", "a.sarif", "--junit-output", "a.xml",
     "--gitlab-output", "g.json", "--html-output", "r.html", "-o", "out.txt"],
    ["check", "m", "--baseline", "b.json", "--write-baseline", "b.json", "--shard", "1/3", "--config", "k.toml"],
    ["check", "m", "--executor", "ray", "--ray-address", "127.0.0.1:6379", "--isolated", "--trust-remote-code"],
    ["check", "m", "--engine-python", "/usr/bin/python3", "--jobs", "16", "--", "--not-an-option"],
])
def test_plain_lines_are_read_as_typer_reads_them(args):
    assert _agree(args)


@pytest.mark.parametrize("args", [
    [], ["rules"], ["--version"], ["check", "--help"], ["check", "m", "-h"],
    ["check", "m", "-j2"], ["check", "m", "-qj", "2"], ["check", "m", "-j", "0"], ["check", "m", "-j", "02"],
    ["check", "m", "--static=1"], ["check", "m", "--static", "--static"], ["check", "m", "--format"],
    ["check", "m", "--format", "--static"], ["check", "m", "--kv-budget", "40GiB"],
    ["check", "m", "--dry-run-timeout", "9"], ["check", ""], ["check", "m", "--deploy", " "],
    ["check", "m", "--bogus"], ["check", "-"], ["check", "m", "--engine", "a", "--engine", "b"],
    ["check", "m", "-e=vllm"],
])
def test_lines_argv_cannot_read_exactly_go_to_typer(args):
    assert argv.read_check(args) is None


TOKENS = st.sampled_from(["check", "m", "n", "--static", "--format", "json", "-j", "2", "3", "--select", "CFG",
                          "--ignore", "X", "-q", "--debug", "--catalog", "c", "--", "-e", "vllm", "--dry-run",
                          "--quiet", "--format=json", "--jobs=4", "-o", "f", "--isolated", "", " ", "-x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=9))
def test_any_line_argv_reads_is_read_as_typer_reads_it(args):
    _agree(args)
