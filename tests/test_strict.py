"""Strict values (kvdoctor/load/strict.py), YAML 1.2 reading (kvdoctor/load/yamlfile.py) and the one-line
usage errors of the command line, checked value by value."""
from __future__ import annotations

import pytest
from helpers import REAL, SHORT, run

from kvdoctor.engines.deploy import load_deploy
from kvdoctor.errors import InputError
from kvdoctor.load.strict import parse_size
from kvdoctor.load.yamlfile import load_yaml

GiB = 1 << 30


@pytest.mark.parametrize("text, size", [("40GiB", 40 * GiB), ("80 GB", 80 * 10**9), (" 1.5TiB ", 3 << 39), ("1B", 1),
                                        ("40gib", 40 * GiB), ("1PiB", 1 << 50), (1024, 1024), ("0.5KiB", 512)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("value, reason", [
    (True, "expected a size"), (40.0, "expected a size"), ("1e3GiB", "expected a size"), ("nanGiB", "expected a size"),
    ("1.5B", "whole number of bytes"), ("0GiB", "out of range"), (0, "out of range"), ("2PiB", "out of range"),
    (2 << 50, "out of range"), ("-1GiB", "expected a size"), ("40GiBs", "expected a size")])
def test_bad_sizes(value, reason):
    with pytest.raises(InputError, match=reason):
        parse_size(value, "--kv-budget")


@pytest.mark.parametrize("text, value", [
    ("yes", "yes"), ("on", "on"), ("No", "No"), ("true", True), ("FALSE", False), ("~", None), ("null", None),
    ("0o17", 15), ("0x1f", 31), ("017", 17), ("1_000", "1_000"), ("2024-01-01", "2024-01-01"), ("1:30", "1:30"),
    ("1e3", 1000.0), (".5", 0.5), ("-.inf", float("-inf")), ("+12", 12), ("0b11", "0b11")])
def test_yaml_12_core_schema(text, value, tmp_path):
    """YAML 1.1 (PyYAML's default) reads yes/on/No as booleans, 017 as octal, 1_000 and 1:30 as
    numbers and 2024-01-01 as a date; YAML 1.2's core schema, which kvdoctor uses, does not."""
    path = tmp_path / "x.yaml"
    path.write_text(f"v: {text}\n")
    got = load_yaml(path, "x")[0]["v"]
    assert got == value and type(got) is type(value)


def test_error_names_file_line_key_and_value(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text("engine: hf\nsglang_mlx:\n  radix_cache: true\n  chunked_prefill_size: true\n")
    with pytest.raises(InputError) as exc:
        load_deploy(str(path))
    assert str(exc.value) == (f"{path}:4: setting 'sglang_mlx.chunked_prefill_size': Input should be a valid integer "
                              "(got true)")


@pytest.mark.parametrize("text, line", [("engine: !!python/name:os.system\n", 1), ("a: 1\nb: !custom x\n", 2)])
def test_every_tag_is_refused(text, line, tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"deploy.yaml:{line}: deploy file has the tag .* tags are not accepted"):
        load_deploy(str(path))


def test_usage_errors_are_one_line_through_the_real_cli():
    model = str(REAL / SHORT["llama-3.1-8b"])
    for args, line in [
        (("check", "--bogus", model), "kvdoctor: error: no such option: --bogus (did you mean --jobs?)"),
        (("check", "--jobs", "0", model), "kvdoctor: error: --jobs '0': input should be greater than or equal to 1"),
        (("check", "--dry-run-timeout", "nan", model),
         "kvdoctor: error: --dry-run-timeout 'nan': input should be a finite number"),
        (("check", ""), "kvdoctor: error: TARGETS '': expected a non-empty name"),
        (("check",), "kvdoctor: error: no models to check: name model directories, or list them under `targets` in kvdoctor.toml"),
    ]:
        proc = run(*args)
        assert (proc.returncode, proc.stderr) == (2, line + "\n"), args


def test_empty_engine_in_the_config_file_is_refused(tmp_path):
    """`engine = ""` in [tool.kvdoctor] was taken as unset (the hf profile ran); it is a typo."""
    (tmp_path / "pyproject.toml").write_text('[tool.kvdoctor]\nengine = ""\n')
    proc = run("check", str(REAL / SHORT["llama-3.1-8b"]), "--static", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"kvdoctor: error: {tmp_path}/pyproject.toml:2: setting 'engine': expected a non-empty name\n"
