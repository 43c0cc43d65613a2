"""`--format junit`: JUnit XML for GitLab (`artifacts:reports:junit`), Jenkins and Azure.

One test suite per target and one test case per target x checked rule, so passing checks show up too.
A finding at or above --fail-on fails its test case; one below it is listed in the case's output. A
target that could not be checked is one test case with an error.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kvdoctor.model import SEVERITIES, Finding, Result
from kvdoctor.report import Report

_INVALID_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _clean(text: str) -> str:
    return _INVALID_XML.sub("?", text)


def _describe(report: Report, result: Result, finding: Finding) -> str:
    path, line = report.location(result, finding)
    where = f"{path}:{line}" if line else path
    layer = "" if finding.layer is None else f" layer {finding.layer}"
    fixes = "".join(f"\n  fix: {fix}" for fix in finding.fixes)
    return _clean(f"{where}:{layer} {finding.code} [{finding.severity}] {finding.message}{fixes}")


def _suite(report: Report, index: int, result: Result) -> ET.Element:
    identity = report.identity(result)
    suite = ET.Element("testsuite", name=f"{identity} [{result.engine}]")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="engine", value=result.engine)
    if result.model_type:
        ET.SubElement(props, "property", name="model_type", value=result.model_type)
    if result.error:
        case = ET.SubElement(suite, "testcase", classname=identity, name="load",
                             file=report.location(result)[0])
        ET.SubElement(case, "error", type="InputError", message=_clean(result.error)).text = _clean(result.error)
        suite.set("tests", "1"), suite.set("failures", "0"), suite.set("errors", "1"), suite.set("skipped", "0")
        return suite
    threshold = SEVERITIES.index(report.fail_on)
    by_code: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_code.setdefault(finding.code, []).append(finding)
    codes = list(dict.fromkeys([*report.checked_codes(index), *sorted(by_code)]))
    failures = 0
    for code in codes:
        brief = report.catalog.brief(code)
        case = ET.SubElement(suite, "testcase", classname=identity,
                             name=f"{code} {brief[0]}" if brief else code)
        findings = by_code.get(code, [])
        if findings:
            path, line = report.location(result, findings[0])
            case.set("file", path)
            if line:
                case.set("line", str(line))
        failing = [f for f in findings if SEVERITIES.index(f.severity) <= threshold]
        if failing:
            failures += 1
            ET.SubElement(case, "failure", type=code, message=_clean(failing[0].message)).text = \
                "\n".join(_describe(report, result, f) for f in failing)
        below = [f for f in findings if SEVERITIES.index(f.severity) > threshold]
        if below:
            ET.SubElement(case, "system-out").text = "\n".join(_describe(report, result, f) for f in below)
    suite.set("tests", str(len(codes))), suite.set("failures", str(failures))
    suite.set("errors", "0"), suite.set("skipped", "0")
    return suite


def render(report: Report) -> str:
    root = ET.Element("testsuites", name="kvdoctor")
    suites = [_suite(report, i, r) for i, r in enumerate(report.results)]
    root.extend(suites)
    for attr in ("tests", "failures", "errors"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
