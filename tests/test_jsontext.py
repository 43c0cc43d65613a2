"""kvdoctor.report.jsontext.indented writes what json.dumps(obj, indent=2) writes, byte for byte."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdoctor.report.jsontext import indented

scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                      max_leaves=30)


@settings(max_examples=500, deadline=None)
@given(values)
def test_any_json_value_is_written_as_json_writes_it(value):
    assert indented(value) == json.dumps(value, indent=2)


@pytest.mark.parametrize("value", [
    {}, [], {"a": []}, [{}, [[]]],
    [1e16, 1e-05, 1e+300, -0.0, 5e-324, 1.7976931348623157e308, 0.1, 100.0, 12345678901234567890],
    {"quote\" back\\ brace{ [ ] } , : \t\n": "\u00e9 \u6f22 \u2028 \U0001f600 \udc80"},
    {"nan": math.nan, "inf": [math.inf, -math.inf]},  # not JSON: json's own encoder writes them
    ({"tuple": (1, 2)}, [True, None, False]),
])
def test_the_spellings_that_differ_between_encoders_elsewhere(value):
    """Exponents with their sign, negative zero, the largest and smallest floats, escapes, empty
    containers, tuples, and NaN and infinities (which the formatter refuses)."""
    assert indented(value) == json.dumps(value, indent=2)


@pytest.mark.parametrize("args", [["--format", "json"], ["--format", "json", "--statistics"],
                                  ["--format", "sarif"], ["--format", "gitlab"]])
def test_reports_are_not_written_by_the_pure_python_encoder(tmp_path, monkeypatch, args):
    """The JSON, SARIF and GitLab reports and the statistics go through json's C encoder."""
    import json.encoder

    from helpers import make_model

    from kvdoctor.cli.main import main

    d = make_model(tmp_path, "kimi-linear", shards=2, edit=lambda c: c.update(auto_map={"AutoModel": "m.M"}))

    def refuse(*args, **kwargs):
        raise AssertionError("json's pure-Python indenting encoder was used")

    monkeypatch.setattr(json.encoder, "_make_iterencode", refuse)
    out = tmp_path / "report.out"
    monkeypatch.setattr("sys.argv", ["kvdoctor", "check", str(d), "--static", "-o", str(out), *args])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert json.loads(out.read_text())  # a document, with what the check found
