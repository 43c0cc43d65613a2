"""JUnit XML: one test case per target x checked rule, passes included, read by a common parser."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import junitparser
import pytest

from helpers import make_model, run


@pytest.fixture(scope="module")
def junit(tmp_path_factory):
    root = tmp_path_factory.mktemp("junit")
    make_model(root, "gpt-oss-20b", dirname="models/clean")
    make_model(root, "gpt-oss-20b", dirname="models/broken",
               edit=lambda c: c.update(layer_types=c["layer_types"][:-1]))
    make_model(root, "llama-3.1-8b", dirname="models/warn", edit=lambda c: c.update(sliding_window=4096))
    out = root / "kvdoctor.xml"
    proc = run("check", "--static", "models/broken", "models/warn", "models/clean", "models/nothing-here",
               "--format", "concise", "--junit-output", str(out), cwd=root)
    assert proc.returncode == 2, proc.stderr
    return out


def static_codes():
    from kvdoctor.pipeline.check import Options, checked_codes
    from kvdoctor.catalog import builtin_catalog

    return checked_codes(Options(catalog=builtin_catalog(), static=True))


def test_junitparser_reads_passes_failures_and_errors(junit):
    xml = junitparser.JUnitXml.fromfile(str(junit))
    suites = {suite.name: suite for suite in xml}
    assert list(suites) == ["models/broken [hf]", "models/warn [hf]", "models/clean [hf]",
                            "models/nothing-here [hf]"]
    codes = static_codes()
    for name in ("models/broken [hf]", "models/warn [hf]", "models/clean [hf]"):
        cases = list(suites[name])
        assert [case.name.split()[0] for case in cases] == codes  # one case per checked rule
    broken = {case.name.split()[0]: case for case in suites["models/broken [hf]"]}
    assert not broken["CFG001"].is_passed
    failure = broken["CFG001"].result[0]
    assert isinstance(failure, junitparser.Failure)
    assert failure.message == "layer_types lists 23 layers but num_hidden_layers is 24"
    assert "fix: " in failure.text
    assert all(case.is_passed for code, case in broken.items() if code != "CFG001")
    # a warning below --fail-on (error) passes, and is listed in the case's output
    warn = {case.name.split()[0]: case for case in suites["models/warn [hf]"]}
    assert warn["CFG004"].is_passed and "CFG004 [warning]" in warn["CFG004"].system_out
    assert all(case.is_passed for case in suites["models/clean [hf]"])
    (load,) = list(suites["models/nothing-here [hf]"])
    assert isinstance(load.result[0], junitparser.Error)


def test_counts_add_up_in_the_xml(junit):
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    n = len(static_codes())
    assert int(root.get("tests")) == 3 * n + 1
    assert int(root.get("failures")) == 1
    assert int(root.get("errors")) == 1
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
    case = next(c for c in root.iter("testcase") if c.get("name").startswith("CFG001"))
    assert case.get("file") == "models/broken/config.json" and int(case.get("line")) > 1


def test_fail_on_warning_fails_the_warning_case(tmp_path):
    make_model(tmp_path, "llama-3.1-8b", dirname="warn", edit=lambda c: c.update(sliding_window=4096))
    proc = run("check", "--static", "warn", "--fail-on", "warning", "--format", "junit", cwd=tmp_path)
    assert proc.returncode == 1
    xml = junitparser.JUnitXml.fromstring(proc.stdout)
    cases = {case.name.split()[0]: case for suite in xml for case in suite}
    assert not cases["CFG004"].is_passed
