"""Command-line misuse: every usage error is one line, `kvdoctor: error: ...`, exit 2.

click (under typer) would print a usage line, a hint and a boxed message and exit 2; argparse-based
engines print usage and one line. kvdoctor keeps the exit code and prints one line naming the option
and the value, so a CI log shows what was wrong. Values are checked with the same strict types as the
deploy file (kvdoctor/load/strict.py): no NaN or infinity, no zero or negative count, no empty path.
"""
from __future__ import annotations

from pathlib import Path

from badinput_base import Built, base_model, case

def _cli(id: str, argv: list[str], names: str, needs_model: bool = True) -> None:
    """`argv` with {m} for a healthy model directory; the error line must contain `names`."""
    @case("cli", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp) if needs_model else tmp
        return Built(str(m), m, names, argv=tuple(a.replace("{m}", str(m)) for a in argv))


# Counts and durations: a zero, negative, fractional, non-finite or non-numeric value is a typo.
for _value in ("0", "-1", "two", "1.5", "1e3", "nan", "", "99999", "0x10", "9" * 40):
    _cli(f"jobs={_value or 'empty'}", ["check", "--jobs", _value, "{m}"], "--jobs")
for _option in ("--dry-run-timeout", "--dry-run-budget"):
    for _value in ("0", "-5", "nan", "NaN", "inf", "-inf", "1e400", "abc", "", "0.5", "86401"):
        _cli(f"{_option.strip('-')}={_value or 'empty'}", ["check", _option, _value, "{m}"], _option)
for _value in ("0", "-5", "abc", "nan", "1e30", "2.5", str(1 << 40), ""):
    _cli(f"budget-context={_value or 'empty'}", ["budget", "{m}", "--context", _value], "--context")
for _option in ("--kv-budget", "--gpu-memory"):
    for _value in ("lots", "0GiB", "1.5B", "nanGiB", "-1GiB", "", "1e3", "2PiB", "inf"):
        _cli(f"budget{_option.replace('--', '-')}={_value or 'empty'}", ["budget", "{m}", _option, _value], _option)

# Empty strings where a path or a target belongs (an empty path would mean the working directory).
_cli("target-empty", ["check", ""], "TARGETS", needs_model=False)
_cli("target-empty-among-good", ["check", "{m}", ""], "TARGETS")
_cli("budget-target-empty", ["budget", ""], "TARGET", needs_model=False)
_cli("triage-log-empty", ["triage", ""], "LOG", needs_model=False)
for _option in ("--deploy", "--config", "--baseline", "--write-baseline"):
    _cli(f"{_option.strip('-')}-empty", ["check", _option, "", "{m}"], _option)
_cli("catalog-empty", ["--catalog", "", "rules"], "--catalog", needs_model=False)
# A target longer than the file system allows (ENAMETOOLONG from stat): one line naming it, not a traceback.
_cli("target-name-too-long", ["check", "--static", "{m}/" + "a" * 300], "File name too long")
_cli("target-path-component-too-long", ["check", "--static", "{m}/" + "a" * 300 + "/b"], "File name too long")
_cli("budget-target-name-too-long", ["budget", "{m}/" + "a" * 300], "File name too long")

# Unknown options (with the nearest spelling), unknown commands, missing values and arguments.
_cli("no-such-option-suggested", ["check", "--jbos", "2", "{m}"], "no such option: --jbos (did you mean --jobs?)")
_cli("no-such-option", ["check", "--bogus", "{m}"], "no such option: --bogus")
_cli("no-such-option-before-command", ["--verbose", "check", "{m}"], "no such option: --verbose")
_cli("no-such-short-option", ["check", "-z", "{m}"], "no such option: -z")
_cli("no-such-command-suggested", ["chekc", "{m}"], "no such command: 'chekc' (did you mean check?)")
_cli("no-such-command", ["lint", "{m}"], "no such command: 'lint'")
_cli("missing-targets", ["check"], "no models to check", needs_model=False)  # TARGETS may come from the config file
_cli("missing-explain-code", ["explain"], "missing argument CODE", needs_model=False)
_cli("missing-budget-target", ["budget"], "missing argument TARGET", needs_model=False)
_cli("missing-option-value", ["check", "{m}", "--jobs"], "--jobs")
_cli("missing-format-value", ["rules", "--format"], "--format", needs_model=False)
_cli("flag-given-a-value", ["check", "--static=yes", "{m}"], "--static")
_cli("version-after-command", ["check", "--version", "{m}"], "no such option: --version")
_cli("no-command", [], "missing command", needs_model=False)

# Bad choices: checked by kvdoctor itself, one line naming the option.
_cli("format-unknown", ["check", "--format", "xml", "{m}"], "--format 'xml'")
_cli("fail-on-unknown", ["check", "--fail-on", "fatal", "{m}"], "--fail-on 'fatal'")
_cli("engine-unknown", ["check", "--engine", "tgi", "{m}"], "--engine")
_cli("engine-empty", ["check", "--engine", "", "{m}"], "--engine")
_cli("select-unknown", ["check", "--select", "NOPE", "{m}"], "--select")
for _option in ("--select", "--extend-select", "--ignore"):  # an empty list would select nothing, silently
    _cli(f"{_option.strip('-')}-empty", ["check", _option, "", "{m}"], _option)
    _cli(f"{_option.strip('-')}-only-commas", ["check", _option, " , ,", "{m}"], _option)
_cli("ignore-unknown", ["check", "--ignore", "ZZZ999", "{m}"], "--ignore")
_cli("severity-no-equals", ["check", "--severity", "CFG001", "{m}"], "--severity")
_cli("severity-bad-level", ["check", "--severity", "CFG001=fatal", "{m}"], "--severity")
_cli("severity-unknown-code", ["check", "--severity", "ZZZ999=info", "{m}"], "--severity")
_cli("dry-run-wrong-engine", ["check", "--dry-run", "{m}"], "--dry-run")
_cli("dry-run-with-static", ["check", "--dry-run", "--static", "--engine", "sglang-mlx", "{m}"], "--dry-run")
_cli("budget-engine-unknown", ["budget", "{m}", "--kv-budget", "40GiB", "--engine", "tgi"], "--engine: unknown engine 'tgi'")
_cli("budget-mode-unknown", ["budget", "{m}", "--kv-budget", "40GiB", "--mode", "some"], "--mode 'some'")
_cli("explain-unknown", ["explain", "XYZ999"], "XYZ999", needs_model=False)
_cli("deploy-missing-file", ["check", "--deploy", "/nonexistent/deploy.yaml", "{m}"], "deploy.yaml")
_cli("config-missing-file", ["check", "--config", "/nonexistent/kvdoctor.toml", "{m}"], "kvdoctor.toml")
_cli("baseline-missing", ["check", "--baseline", "/nonexistent/base.json", "{m}"], "base.json")
_cli("output-file-in-missing-dir", ["check", "--format", "json", "-o", "/nonexistent/dir/out.json", "{m}"], "out.json")
_cli("triage-missing-log", ["triage", "/nonexistent/server.log"], "server.log", needs_model=False)
_cli("catalog-dir-missing", ["--catalog", "/nonexistent/rules", "rules"], "/nonexistent/rules", needs_model=False)
