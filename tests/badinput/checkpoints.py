"""Safetensors headers (every field of an entry, offsets, overflow) and the shard index (traversal in
shard names and in weight_map, shards that are devices or links).

The truth for a header is the safetensors library: what `safe_open` refuses, kvdoctor refuses in one
line naming the file (safetensors checks dtype names, that shape times dtype size equals the offsets'
span, that offsets are contiguous from 0 and end at the file's end, and that the header is a JSON
object of objects with a string-to-string `__metadata__`). For the index, transformers joins each
`weight_map` value to the model folder and opens it, so `../x` or an absolute path would read outside
the model; kvdoctor refuses those, and reports a name that is merely missing as CKPT005.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from badinput_base import INDEX, Built, base_model, case, read_header, write_header

def _edit_entry(id: str, edit: Callable[[dict], Any], ok: bool = False, code: str | None = None) -> None:
    """Change the first tensor's entry of the healthy model's header in place."""
    @case("checkpoint", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp)
        path = m / "model.safetensors"
        header, data = read_header(path)
        first = next(k for k in header if k != "__metadata__")
        edit(header[first])
        write_header(path, header, data)
        return Built(str(m), m, None if ok or code else "model.safetensors", code)


def _set(key: str, value: Any) -> Callable[[dict], None]:
    return lambda entry: entry.__setitem__(key, value)


def _drop(key: str) -> Callable[[dict], None]:
    return lambda entry: entry.pop(key)


# dtype: safetensors knows a fixed set of upper-case names; anything else is "unknown variant".
for _id, _value in [("null", None), ("empty", ""), ("list", ["BF16"]), ("object", {"name": "BF16"}),
                    ("trailing-space", "BF16 "), ("nul-suffix", "BF16\u0000"), ("torch-name", "bfloat16"),
                    ("bool", True), ("long", "B" * 10_000), ("mixed-case", "Bf16")]:
    _edit_entry(f"dtype-{_id}", _set("dtype", _value))
_edit_entry("dtype-missing", _drop("dtype"))
# shape: a list of non-negative integers whose product, times the dtype size, is the byte span.
for _id, _value in [("null", None), ("object", {"0": 4}), ("nested", [[256, 64]]), ("string-dims", ["256", "64"]),
                    ("negative-dim", [-256, -64]), ("float-dims", [256.0, 64.0]), ("huge-dim", [2**64, 1]),
                    ("product-overflow-u64", [2**32, 2**32, 2]), ("bool-dims", [True, 64]), ("transposed", [64, 256]),
                    ("extra-unit-dim", [256, 64, 1])]:
    # transposed and extra-unit-dim keep the byte span, so safetensors takes them. The embedding's
    # rows no longer match vocab_size when transposed (CKPT003); a trailing unit dimension is not
    # compared by kvdoctor (transformers' loader would refuse the size mismatch): accepted, a known gap.
    _edit_entry(f"shape-{_id}", _set("shape", _value), code="CKPT003" if _id == "transposed" else None,
                ok=_id == "extra-unit-dim")
_edit_entry("shape-missing", _drop("shape"))
# data_offsets: exactly [begin, end] integers, begin <= end, contiguous, within the data.
for _id, _value in [("null", None), ("empty", []), ("one", [0]), ("floats", [0.0, 32768.0]), ("bools", [False, True]),
                    ("huge", [0, 2**64]), ("2-to-63", [2**63, 2**63 + 32768]), ("negative-end", [0, -1]),
                    ("object", {"begin": 0, "end": 32768}), ("strings", ["0", "32768"])]:
    _edit_entry(f"offsets-{_id}", _set("data_offsets", _value))
_edit_entry("offsets-missing", _drop("data_offsets"))
_edit_entry("entry-extra-key", _set("quantization", "int4"), ok=True)  # safe_open ignores unknown entry fields
_edit_entry("entry-empty", lambda e: e.clear())


def _whole(id: str, edit: Callable[[dict], Any], ok: bool = False, data_delta: int = 0) -> None:
    """Change the whole header (add or remove entries, metadata)."""
    @case("checkpoint", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp)
        path = m / "model.safetensors"
        header, data = read_header(path)
        edit(header)
        write_header(path, header, data + data_delta)
        return Built(str(m), m, None if ok else "model.safetensors")


_whole("metadata-absent", lambda h: h.pop("__metadata__"), ok=True)  # optional in safetensors
_whole("metadata-empty", lambda h: h.__setitem__("__metadata__", {}), ok=True)
_whole("metadata-extra-strings", lambda h: h["__metadata__"].update(note="x" * 1000, origin="\u6a21"), ok=True)
_whole("metadata-null", lambda h: h.__setitem__("__metadata__", None))
_whole("metadata-nested", lambda h: h["__metadata__"].update(n={"a": "b"}))
_whole("metadata-bool-value", lambda h: h["__metadata__"].update(n=True))
_whole("metadata-null-value", lambda h: h["__metadata__"].update(n=None))
_whole("metadata-shaped-like-tensor",  # __metadata__ is never a tensor: its values must be strings
       lambda h: h.__setitem__("__metadata__", {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}))
_whole("empty-header-with-data", lambda h: [h.pop(k) for k in list(h) if k != "__metadata__"])
_whole("extra-tensor-past-end", lambda h: h.__setitem__("zzz.extra", {"dtype": "F32", "shape": [4],
                                                                       "data_offsets": [10**9, 10**9 + 16]}))
_whole("data-one-byte-short", lambda h: None, data_delta=-1)
_whole("data-one-byte-long", lambda h: None, data_delta=1)


@case("checkpoint", "header-length-zero")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    header, data = read_header(m / "model.safetensors")
    write_header(m / "model.safetensors", header, data, length=0)
    return Built(str(m), m, "model.safetensors")


@case("checkpoint", "header-length-one-short")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    header, data = read_header(m / "model.safetensors")
    write_header(m / "model.safetensors", header, data, length=len(json.dumps(header)) - 1)
    return Built(str(m), m, "model.safetensors")


@case("checkpoint", "header-length-one-long")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    header, data = read_header(m / "model.safetensors")
    write_header(m / "model.safetensors", header, data, length=len(json.dumps(header)) + 1)
    return Built(str(m), m, "model.safetensors")


@case("checkpoint", "seven-byte-file")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "model.safetensors").write_bytes(b"\x10\0\0\0\0\0\0")  # shorter than the length prefix
    return Built(str(m), m, "model.safetensors")


@case("checkpoint", "tensor-names-with-traversal")
def _(tmp: Path) -> Built:
    """Tensor names are keys, not paths: `../../etc/passwd` is just an unexpected tensor name to
    transformers (reported as unexpected keys) and to kvdoctor (no file is opened by it)."""
    m = base_model(tmp)
    header, data = read_header(m / "model.safetensors")
    header["../../etc/passwd"] = {"dtype": "U8", "shape": [4], "data_offsets": [data, data + 4]}
    write_header(m / "model.safetensors", header, data + 4)
    return Built(str(m), m, None, accepted=True)


# --- the shard index ---------------------------------------------------------------------------------
def _index(id: str, edit: Callable[[dict, list[str], Path], Any], names: str | None = INDEX,
           code: str | None = None, ok: bool = False) -> None:
    @case("index", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp, shards=2)
        index = json.loads((m / INDEX).read_text())
        shards = sorted(set(index["weight_map"].values()))
        edit(index, shards, m)
        (m / INDEX).write_text(json.dumps(index, indent=1))
        return Built(str(m), m, None if ok or code else names, code)


def _first_to(value: Any) -> Callable[[dict, list[str], Path], None]:
    def edit(index: dict, shards: list[str], m: Path) -> None:
        index["weight_map"][next(iter(index["weight_map"]))] = value
    return edit


def _all_to(make: Callable[[str], str]) -> Callable[[dict, list[str], Path], None]:
    def edit(index: dict, shards: list[str], m: Path) -> None:
        index["weight_map"] = {k: make(v) for k, v in index["weight_map"].items()}
    return edit


# Traversal: transformers would open <model>/<value>; these lead out of the model directory.
for _id, _value in [("dotdot-deep", "../../../../../../etc/shadow.safetensors"), ("home", "~/x.safetensors"),
                    ("dev-zero", "/dev/zero"), ("proc", "/proc/self/mem"),
                    ("dotdot-after-name", "a/../../x.safetensors"), ("double-slash-root", "//etc/x.safetensors"),
                    ("dotdot-only", ".."), ("dot-slash-dotdot", "./../x.safetensors"),
                    ("trailing-slash", "model-00001-of-00002.safetensors/"), ("nul-in-middle", "model\0.safetensors")]:
    _index(f"weight-map-{_id}", _first_to(_value))
# Not traversal on Linux, only names of files that are not there, for a tensor that is stored in a
# real shard: transformers would fail to open the named file; kvdoctor names the index and the tensor.
for _id, _value in [("backslash", "..\\x.safetensors"), ("percent-encoded", "%2e%2e%2fx.safetensors"),
                    ("fullwidth-dots", "\uff0e\uff0e_x.safetensors"), ("spaces", " model.safetensors "),
                    ("other-case", "MODEL-00001-OF-00002.SAFETENSORS")]:
    _index(f"weight-map-{_id}", _first_to(_value))
_index("weight-map-name-too-long", _first_to("a" * 5000 + ".safetensors"))  # ENAMETOOLONG from open()
_index("weight-map-float", _first_to(1.5))
_index("weight-map-bool", _first_to(True))
_index("weight-map-object", _first_to({"file": "model-00001-of-00002.safetensors"}))
_index("weight-map-all-dot-slash", _all_to(lambda v: "./" + v), ok=True)  # os.path.join keeps it inside
_index("metadata-total-size-wrong", lambda i, s, m: i["metadata"].__setitem__("total_size", 1), ok=True)
_index("metadata-total-size-string", lambda i, s, m: i["metadata"].__setitem__("total_size", "big"), ok=True)
_index("metadata-absent", lambda i, s, m: i.pop("metadata"), ok=True)  # transformers reads weight_map only
_index("weight-map-null", lambda i, s, m: i.__setitem__("weight_map", None))
_index("weight-map-string", lambda i, s, m: i.__setitem__("weight_map", "model.safetensors"))
# A weight_map key is a tensor name, never opened: transformers ignores an entry no shard holds.
_index("tensor-name-traversal", lambda i, s, m: i["weight_map"].__setitem__("../../etc/passwd", s[0]), ok=True)


def _shard_swap(id: str, make: Callable[[Path, Path], None], names_shard: bool = True) -> None:
    """Replace the first indexed shard by something else."""
    @case("index", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp, shards=2)
        shard = sorted(m.glob("*.safetensors"))[0]
        make(shard, tmp)
        return Built(str(m), m, shard.name)


def _to_link(target: str) -> Callable[[Path, Path], None]:
    def make(shard: Path, tmp: Path) -> None:
        shard.unlink()
        shard.symlink_to(target)
    return make


_shard_swap("shard-link-dev-null", _to_link("/dev/null"))
_shard_swap("shard-link-dev-zero", _to_link("/dev/zero"))
_shard_swap("shard-link-dev-urandom", _to_link("/dev/urandom"))
_shard_swap("shard-link-proc-stdin", _to_link("/proc/self/fd/0"))
_shard_swap("shard-link-to-itself-via-dir", _to_link("../model/model-00001-of-00002.safetensors"))
_shard_swap("shard-link-to-dir", _to_link("."))
_shard_swap("shard-empty-file", lambda shard, tmp: shard.write_bytes(b""))


@case("index", "shard-link-to-other-shard")
def _(tmp: Path) -> Built:
    """Two index names, one file: the second shard then holds the first one's tensors, which the
    index maps elsewhere (transformers would load the wrong tensors)."""
    m = base_model(tmp, shards=2)
    first, second = sorted(m.glob("*.safetensors"))
    second.unlink()
    second.symlink_to(first.name)
    return Built(str(m), m, second.name)
