"""Encodings and JSON syntax of config.json, the shard index and the safetensors header.

transformers reads config.json with `open(path, encoding="utf-8")` and `json.loads`
(PretrainedConfig._dict_from_json_file), so text that is not UTF-8, a byte-order mark, a comment, a
trailing comma or trailing data makes it raise; kvdoctor refuses the same files, in one line, before
the engine would. Strict JSON that transformers accepts (CRLF, escapes, any Unicode, big but bounded
values under an unknown key, which it keeps as an attribute) must pass cleanly. Where Python's json is
looser than the JSON standard (NaN, duplicate keys, 5000-digit integers) kvdoctor is stricter than
transformers, and says so in the comment.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from badinput_base import INDEX, Built, base_model, case, config_case, read_header, tiny_config, write_header

GOOD = json.dumps(tiny_config(), indent=2)
BODY = GOOD[1:-1].strip()  # the members, to wrap in other syntax


_config = partial(config_case, "encoding")  # (id, content, ok=False)


def _with(extra: str) -> str:
    """The healthy config with `extra` (raw JSON text of one more member) added."""
    return "{" + BODY + ", " + extra + "}"


# --- byte encodings: transformers decodes as UTF-8 and raises; so does kvdoctor ----------------------
for _id, _codec in [("utf16-le-bom", "utf-16"), ("utf16-le", "utf-16-le"), ("utf16-be", "utf-16-be"),
                    ("utf32-bom", "utf-32"), ("utf32-le", "utf-32-le"), ("utf32-be", "utf-32-be"),
                    ("cp1252", "cp1252")]:
    text = GOOD if _codec != "cp1252" else _with('"_note": "caf\u00e9 \u20ac"')
    _config(_id, text.encode(_codec))
_config("utf16-be-bom", b"\xfe\xff" + GOOD.encode("utf-16-be"))
_config("utf8-bom-twice", b"\xef\xbb\xbf\xef\xbb\xbf" + GOOD.encode())  # json.loads: "Unexpected UTF-8 BOM"
_config("utf8-bom-after-space", b" \xef\xbb\xbf" + GOOD.encode())  # U+FEFF is not JSON whitespace
_config("overlong-utf8", _with('"_note": "x"').encode().replace(b'"x"', b'"\xc0\xaf"'))  # invalid UTF-8
_config("utf8-encoded-surrogate", _with('"_note": "x"').encode().replace(b'"x"', b'"\xed\xa0\x80"'))  # CESU
_config("five-byte-sequence", _with('"_note": "x"').encode().replace(b'"x"', b'"\xf8\x88\x80\x80\x80"'))
_config("truncated-multibyte", GOOD.encode()[:-1] + b"\xe2\x82")  # cut inside a character
_config("latin1-key", _with('"x": 1').encode().replace(b'"x"', b'"\xe9"'))

# --- NUL and control characters -----------------------------------------------------------------------
_config("nul-after-document", GOOD + "\0")  # json.loads: "Extra data"
_config("nul-before-document", "\0" + GOOD)
_config("nul-inside-string", _with('"_note": "a\0b"'))  # strict JSON: control characters must be escaped
_config("tab-inside-string", _with('"_note": "a\tb"'))
_config("newline-inside-string", _with('"_note": "a\nb"'))
_config("nul-escaped", _with('"_note": "a\\u0000b"'), ok=True)  # a valid escape: transformers keeps it
_config("form-feed-between-tokens", GOOD.replace(",", ",\f", 1))  # \f is not JSON whitespace
_config("nbsp-between-tokens", GOOD.replace(",", ",\u00a0", 1))
_config("vertical-tab-between-tokens", GOOD.replace(",", ",\v", 1))
_config("crlf-line-endings", GOOD.replace("\n", "\r\n"), ok=True)  # JSON whitespace: accepted
_config("cr-line-endings", GOOD.replace("\n", "\r"), ok=True)
_config("no-whitespace", json.dumps(tiny_config(), separators=(",", ":")), ok=True)

# --- Unicode that is valid: transformers keeps it, so must we ----------------------------------------
_config("cjk-value", _with('"_name_or_path": "\u6a21\u578b/\u00fc"'), ok=True)
_config("emoji-value", _with('"_note": "\U0001f600"'), ok=True)
_config("escaped-surrogate-pair", _with('"_note": "\\ud83d\\ude00"'), ok=True)
_config("rtl-override-value", _with('"_note": "\u202eevil"'), ok=True)
_config("unicode-key", _with('"\u00e9t\u00e9": 1'), ok=True)
_config("lone-low-surrogate-key", _with('"\\udc00": 1'))  # no file name or report can carry it
_config("lone-high-surrogate-nested", _with('"_n": {"k": ["\\ud800"]}'))

# --- comments, trailing data, JSON5 and Python spellings: json.loads raises on all --------------------
for _id, _text in [
    ("block-comment", "{/* c */" + BODY + "}"), ("hash-comment", "{# c\n" + BODY + "}"),
    ("comment-after", GOOD + "\n// end\n"), ("trailing-brace", GOOD + "}"), ("trailing-garbage", GOOD + "x"),
    ("two-objects-spaced", GOOD + "\n" + GOOD), ("trailing-comma-array", _with('"_n": [1, 2,]')),
    ("unquoted-key", _with("_n: 1")), ("hex-number", _with('"_n": 0x10')), ("leading-zero", _with('"_n": 010')),
    ("plus-sign", _with('"_n": +1')), ("leading-dot", _with('"_n": .5')), ("trailing-dot", _with('"_n": 1.')),
    ("python-true", _with('"_n": True')), ("python-none", _with('"_n": None')), ("undefined", _with('"_n": undefined')),
    ("single-quoted-value", _with("\"_n\": 'x'")), ("missing-colon", _with('"_n" 1')),
    ("missing-comma", _with('"_n": 1 "_m": 2')),
    ("bad-escape", _with('"_n": "\\x41"')), ("short-unicode-escape", _with('"_n": "\\u12"')),
    ("unclosed-string", "{" + BODY + ', "_n": "abc}'), ("unclosed-array", _with('"_n": [1, 2')),
    ("nan-lowercase", _with('"_n": nan')),  # not even Python's json takes a lowercase nan
]:
    _config(_id, _text)
_config("whitespace-after", GOOD + "\n\n   \n", ok=True)
# Python's json (so transformers) reads NaN and Infinity, and published configs carry them (Nemotron-H's
# time_step_limit): accepted where they land in a key no layer depends on.
_config("infinity-in-array", _with('"_n": [1, Infinity]'), ok=True)
_config("nan-nested", _with('"_n": {"x": NaN}'), ok=True)

# --- numbers: bounded digits, finite floats ------------------------------------------------------------
_config("int-30-digits", _with('"_n": ' + "9" * 30), ok=True)  # at the bound
_config("int-31-digits", _with('"_n": ' + "9" * 31))
_config("int-negative-31-digits", _with('"_n": -' + "9" * 31))
_config("int-4301-digits", _with('"_n": ' + "1" * 4301))  # past Python's own int-parsing limit: ValueError
_config("float-long-mantissa", _with('"_n": 1.' + "0" * 400), ok=True)  # parses to 1.0
_config("float-max", _with('"_n": 1.7976931348623157e308'), ok=True)
_config("float-overflow-negative", _with('"_n": -1e309'), ok=True)  # json.loads makes -inf, as Python reads it
_config("float-underflow", _with('"_n": 1e-400'), ok=True)  # 0.0: finite
_config("float-exponent-huge", _with('"_n": 1e99999999999'), ok=True)  # inf to json.loads, in an unused key
_config("negative-zero", _with('"_n": -0'), ok=True)
_config("layers-as-exponent", GOOD.replace('"num_hidden_layers": 2', '"num_hidden_layers": 2e0'))  # a float

# --- nesting and size ----------------------------------------------------------------------------------
_config("depth-64", _with('"_n": ' + "[" * 63 + "]" * 63), ok=True)  # the top object plus 63: at the bound
_config("depth-65-objects", _with('"_n": ' + '{"a": ' * 64 + "1" + "}" * 64))
_config("depth-mixed-100", _with('"_n": ' + '[{"a": ' * 50 + "1" + "}]" * 50))
_config("huge-string-8mib", _with('"_n": "' + "x" * (8 * 1024 * 1024) + '"'), ok=True)  # under 16 MiB
_config("huge-string-17mib", _with('"_n": "' + "x" * (17 * 1024 * 1024) + '"'))  # past the size bound
_config("huge-key", _with('"' + "k" * 1_000_000 + '": 1'), ok=True)
_config("many-keys", "{" + BODY + "".join(f', "_k{i}": {i}' for i in range(50_000)) + "}", ok=True)

# --- duplicate keys (Python's json keeps the last one silently; kvdoctor refuses the ambiguity) -------
_config("duplicate-escaped-key", _with('"num_hidden_\\u006cayers": 3'))  # the same key, spelled twice
_config("duplicate-in-text-config", GOOD[:-1] + ', "text_config": {"model_type": "llama", "hidden_size": 64, '
        '"hidden_size": 32}}')
_config("duplicate-in-array-object", _with('"_n": [{"a": 1, "a": 2}]'))
_config("duplicate-model-type-last", GOOD[:-1] + ', "model_type": "mistral"}')
_config("case-differs-not-duplicate", _with('"Num_Hidden_Layers": 3'), ok=True)  # a different key


# --- the same byte-level problems in the shard index and the safetensors header ------------------------
def _index(id: str, transform, ok: bool = False) -> None:
    @case("encoding", f"index-{id}")
    def build(tmp: Path) -> Built:
        m = base_model(tmp, shards=2)
        (m / INDEX).write_bytes(transform((m / INDEX).read_bytes()))
        return Built(str(m), m, None if ok else INDEX)


# transformers reads the index with json.loads too (modeling_utils' sharded loading).
_index("bom", lambda b: b"\xef\xbb\xbf" + b)
_index("utf16", lambda b: b.decode().encode("utf-16"))
_index("nul-after", lambda b: b + b"\0")
_index("comment", lambda b: b"// index\n" + b)
_index("trailing-data", lambda b: b + b"{}")
_index("truncated", lambda b: b[: len(b) // 2])
_index("not-utf8", lambda b: b.replace(b"model.norm.weight", b"model.n\xffrm.weight"))
_index("crlf", lambda b: b.replace(b"\n", b"\r\n"), ok=True)
_index("minified", lambda b: json.dumps(json.loads(b), separators=(",", ":")).encode(), ok=True)


def _header(id: str, transform, ok: bool = False) -> None:
    @case("encoding", f"header-{id}")
    def build(tmp: Path) -> Built:
        m = base_model(tmp)
        path = m / "model.safetensors"
        header, data = read_header(path)
        write_header(path, transform(json.dumps(header).encode()), data)
        return Built(str(m), m, None if ok else "model.safetensors")


# The safetensors library parses the header with serde_json from UTF-8: JSON whitespace around the
# object is accepted (writers pad the header to 8 bytes with 0x20); a BOM, UTF-16, NUL, a comment or
# trailing data make it refuse ("invalid JSON in header"). Checked against safetensors' safe_open.
_header("trailing-spaces", lambda b: b + b"    ", ok=True)
_header("trailing-newline", lambda b: b + b"\n", ok=True)
_header("leading-space", lambda b: b" " + b, ok=True)
_header("leading-newline", lambda b: b"\n" + b, ok=True)
_header("bom", lambda b: b"\xef\xbb\xbf" + b)
_header("utf16", lambda b: b.decode().encode("utf-16"))
_header("nul-padding", lambda b: b + b"\0\0\0\0")
_header("trailing-object", lambda b: b + b"{}")
_header("comment", lambda b: b"/*x*/" + b)
