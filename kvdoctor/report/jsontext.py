"""JSON text exactly as `json.dumps(obj, indent=2)` writes it, without json's pure-Python encoder.

json encodes in C only when it does not indent; its indenting encoder is Python, and it took a
sixth of the checking time of a fleet of 100 models (their entries of the JSON report). So the
text is encoded compactly by json's C encoder, which writes every number, string and escape as the
indenting one does, and msgspec's formatter, which keeps each token as it is, indents it. json also
writes NaN and infinities, which are not JSON: the formatter refuses those documents, and they take
json's own indenting encoder.
"""
from __future__ import annotations

import json
from typing import Any

import msgspec

_COMPACT = json.JSONEncoder(separators=(",", ":"))  # no indent: json's C encoder


def indented(obj: Any) -> str:
    text = _COMPACT.encode(obj)
    try:
        return msgspec.json.format(text, indent=2)
    except msgspec.DecodeError:  # NaN or an infinity
        return json.dumps(obj, indent=2)
