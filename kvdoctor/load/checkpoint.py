"""Safetensors checkpoints, headers only.

Each file's 8-byte length prefix is checked against a bound and the file size before anything else
is read. The header is then parsed and every entry checked: known dtype, shape of non-negative
integers, byte span matching the shape, spans contiguous and covering the data, no name twice. The
safetensors library then opens the file as a second opinion (it maps the file, never reads data).
Tensor data is never read.

A model read from a Hub has no shard files here, only each shard's first bytes (`NAME.header`, see
`kvdoctor.load.hub`) and its true size, which every check against the file size uses instead.
"""
from __future__ import annotations

import gc
import json
import os
import struct
from itertools import repeat
from math import prod
from operator import attrgetter, itemgetter, mul, sub
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from kvdoctor.errors import InputError
from kvdoctor.load.jsonfile import is_utf8, load_json, open_regular, reject_constant, require_inside, show
from kvdoctor.limits import MAX_HEADER_BYTES, MAX_SHARDS, MAX_TOTAL_HEADER_BYTES
from kvdoctor.model import Checkpoint, TensorInfo

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
HEADER_SUFFIX = ".header"  # a shard's header bytes fetched from a Hub: NAME.safetensors.header
MAX_RANK = 64  # numpy's own limit on dimensions

# Bits per element of every safetensors dtype.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
METADATA_KEY = b'"__metadata__"'
METADATA_FIRST = b'{"__metadata__":{'  # where safetensors' own writer puts it

_Count = Annotated[int, msgspec.Meta(ge=0)]


class _Entry(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A header entry as the format defines it; what does not fit is refused while decoding."""

    dtype: Literal[tuple(DTYPE_BITS)]  # type: ignore[valid-type]
    shape: Annotated[tuple[_Count, ...], msgspec.Meta(max_length=MAX_RANK)]
    data_offsets: tuple[_Count, _Count]


_HEADER = msgspec.json.Decoder(dict[str, _Entry])
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E5M2", "F8_E4M3"}


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"name {show(key)} appears twice; expected each tensor once")
        seen[key] = value
    return seen


def read_header(path: Path, label: str, limit: int = MAX_HEADER_BYTES,
                library_check: bool = True, size: int | None = None) -> tuple[dict[str, TensorInfo], int]:
    """Read one safetensors header: ({name: TensorInfo}, header length). InputError on anything malformed.

    kvdoctor's own checks cover the whole format; `library_check` also has the safetensors library
    open the file, as an engine's loader would. That costs a numpy import (~0.1 s), so a `--static`
    check skips it. `size` is the true size of a shard whose header bytes alone are at `path` (read
    from a Hub): the library cannot open those, so it is not asked."""
    tensors, length = _parse_header(path, label, limit, size)
    if library_check and size is None:
        _validate_with_library(path)  # after the parsed header is freed: one copy in memory at a time
    return tensors, length


def _parse_header(path: Path, label: str, limit: int, true_size: int | None) -> tuple[dict[str, TensorInfo], int]:
    fh, size = open_regular(path, "safetensors file")
    size = size if true_size is None else true_size
    with fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise InputError(f"{path}: truncated safetensors file: {len(prefix)} bytes; expected an 8-byte "
                             "header length at byte 0")
        (length,) = struct.unpack("<Q", prefix)
        if length > limit:
            raise InputError(f"{path}: safetensors header length {length} at byte 0 exceeds the {limit}-byte bound "
                             f"(at most {MAX_HEADER_BYTES} a file and {MAX_TOTAL_HEADER_BYTES} a checkpoint)")
        if 8 + length > size:
            raise InputError(f"{path}: truncated safetensors header: the length at byte 0 says {length} bytes but "
                             f"the file has {size - 8} after byte 8")
        try:
            raw = fh.read(length)
        except OSError as exc:
            raise InputError(f"{path}: cannot read safetensors file: {exc.strerror or exc}") from None
    if len(raw) < length:  # header bytes kept from a Hub, cut short
        raise InputError(f"{path}: truncated safetensors header: {len(raw)} bytes after byte 8; expected {length}")
    tensors = _valid_entries(raw, data_start=8 + length, data_size=size - 8 - length, label=label)
    if tensors is not None:
        return tensors, length
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: safetensors header is not UTF-8 (byte offset {8 + exc.start})") from None
    # Something is wrong: the entry-by-entry path below finds it and says what, in one line.
    try:
        header = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=reject_constant)
    except RecursionError:
        raise InputError(f"{path}: safetensors header (bytes 8..{8 + length}) nests too deeply") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: safetensors header is not valid JSON at byte offset {8 + exc.pos}: "
                         f"{exc.msg}") from None
    except ValueError as exc:
        raise InputError(f"{path}: safetensors header (bytes 8..{8 + length}) is not valid: {exc}") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header must be a JSON object, got {type(header).__name__}")
    return _entries(path, header, data_start=8 + length, data_size=size - 8 - length, label=label), length


def _valid_entries(raw: bytes, data_start: int, data_size: int, label: str) -> dict[str, TensorInfo] | None:
    """The tensors of a header that passes every check of `_entries`, or None when any check fails.

    msgspec decodes the entries straight into typed records, refusing in C what the format forbids
    (an unknown dtype, a shape that is not a list of at most 64 non-negative integers, offsets that
    are not two, a missing or extra key); the byte spans are then checked column by column (C-level
    map, sorted and compare, no Python code per entry). None sends the header to `_entries`, which
    finds the first fault and reports it exactly as before.

    A JSON object given a key twice keeps the last value, so the quotes are counted: with no
    backslash in the text every string is its raw spelling between two quotes, and a valid header
    holds exactly the strings the decoded entries account for (names, the three keys of each entry,
    its dtype, the metadata's keys and values). A name given twice, at any level, leaves more quotes
    than that. The metadata is taken only where safetensors writes it, first."""
    if b"\\" in raw:  # an escape can spell one name two ways
        return None
    whole, strings = raw, 0
    if raw.startswith(METADATA_FIRST):
        end = raw.find(b"}", len(METADATA_FIRST)) + 1  # no braces inside: else the slice is not one object
        try:
            meta = json.loads(raw[len(METADATA_FIRST) - 1:end])
        except ValueError:
            return None
        if set(map(type, meta.values())) - {str} or raw[end:end + 1] not in (b",", b"}"):
            return None
        strings = 1 + 2 * len(meta)
        raw = b"{" + raw[end + 1:] if raw[end:end + 1] == b"," else b"{}" + raw[end + 1:]
    elif METADATA_KEY in raw:
        return None
    try:
        header = _HEADER.decode(raw)
    except (msgspec.MsgspecError, RecursionError):  # deep nesting: the careful path says so
        return None
    if whole.count(b'"') != 2 * (strings + 5 * len(header)):  # each entry: its name, three keys, a dtype
        return None
    if not header:
        return {} if data_size == 0 else None
    names, entries = list(header), list(header.values())
    dtypes = list(map(attrgetter("dtype"), entries))
    shapes = list(map(attrgetter("shape"), entries))
    begins, ends = map(list, zip(*map(attrgetter("data_offsets"), entries)))
    sizes = list(map(sub, ends, begins))
    # numel x bits == 8 x span: whole bytes, the right length, and so begin <= end
    if list(map(mul, map(prod, shapes), map(DTYPE_BITS.__getitem__, dtypes))) != list(map(mul, sizes, repeat(8))):
        return None
    if not _tiles(begins, ends, sizes, data_size):
        return None
    rows = zip(names, dtypes, shapes, repeat(label))
    return dict(zip(names, map(tuple.__new__, repeat(TensorInfo), rows)))


def _tiles(begins: list[int], ends: list[int], sizes: list[int], data_size: int) -> bool:
    """Whether the spans cover 0..data_size exactly, each starting where the one before ends.

    With every span non-empty, sorting begins and ends apart is enough: each offset other than 0
    and data_size then starts as many spans as end there, so the spans, all going forward, chain
    into one path from 0 to data_size. An empty span can sit inside another, so then the pairs
    are sorted together, as `_entries` does."""
    if 0 in sizes:
        pairs = sorted(zip(begins, ends))
        starts, stops = [b for b, _ in pairs], [e for _, e in pairs]
    else:
        starts, stops = sorted(begins), sorted(ends)
    return starts[0] == 0 and starts[1:] == stops[:-1] and stops[-1] == data_size


def _entries(path: Path, header: dict, data_start: int, data_size: int, label: str) -> dict[str, TensorInfo]:
    """Check each entry against the safetensors format and return the tensors it describes.

    This runs on every tensor of a checkpoint (20k and more), so the common case is a few cheap
    tests and the message for a failing entry is built only when one fails."""
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    bits_of = DTYPE_BITS
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise InputError(f"{path}: safetensors __metadata__ must map names to strings")
            continue
        if type(entry) is not dict:
            _bad_entry(path, name, entry, data_start)
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (type(shape) is not list or len(shape) > MAX_RANK or type(offsets) is not list or len(offsets) != 2
                or type(dtype) is not str or dtype not in bits_of):
            _bad_entry(path, name, entry, data_start)
        numel = 1
        for d in shape:
            if type(d) is not int or d < 0:
                _bad_entry(path, name, entry, data_start)
            numel *= d
        begin, end = offsets
        bits = numel * bits_of[dtype]
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end or bits % 8 \
                or end - begin != bits // 8:
            _bad_entry(path, name, entry, data_start)
        spans.append((begin, end, name))
        tensors[name] = TensorInfo(name, dtype, tuple(shape), label)
    position, previous = 0, None
    for begin, end, name in sorted(spans):
        if begin != position:
            problem = f"overlaps tensor {show(previous)}" if begin < position else "leaves a gap before it"
            raise InputError(f"{path}: tensor {show(name)} starts at file byte {data_start + begin}, which {problem}; "
                             f"expected the next tensor to start at byte {data_start + position}")
        position, previous = end, name
    if position != data_size:
        raise InputError(f"{path}: the tensors' data ends at file byte {data_start + position} but the file ends at "
                         f"byte {data_start + data_size}; expected them to match")
    return tensors


def _bad_entry(path: Path, name: str, entry: Any, data_start: int) -> None:
    """Raise the one-line error that says what is wrong with a header entry the fast path refused."""
    where = f"{path}: tensor {show(name)}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise InputError(f"{where}: expected an entry with 'dtype', 'shape' and 'data_offsets'")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise InputError(f"{where}: unknown dtype {show(dtype)}; expected one of {', '.join(DTYPE_BITS)}")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise InputError(f"{where}: shape {show(shape)}; expected a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise InputError(f"{where}: shape has {len(shape)} dimensions; at most {MAX_RANK} are accepted")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise InputError(f"{where}: data_offsets {show(offsets)}; expected [begin, end] with 0 <= begin <= end")
    numel = 1
    for d in shape:
        numel *= d
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8:
        raise InputError(f"{where}: {numel} elements of {dtype} do not fill whole bytes")
    begin, end = offsets
    raise InputError(f"{where}: shape {shape} of {dtype} is {bits // 8} bytes but data_offsets {offsets} "
                     f"span {end - begin} (file bytes {data_start + begin}..{data_start + end})")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _validate_with_library(path: Path) -> None:
    """Let the safetensors library open the file too: what it refuses, an engine's loader refuses."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except SafetensorError as exc:
        raise InputError(f"{path}: invalid safetensors header: {exc}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: invalid safetensors file: {exc}") from None


def _shard_path(model_dir: Path, root: Path, name: str, index_path: Path, remote: bool = False) -> Path:
    """The path of a shard the index names: a .safetensors file inside the model directory (its
    header bytes, for a model read from a Hub)."""
    check_shard_name(name, index_path)
    path = model_dir / (name + HEADER_SUFFIX if remote else name)
    if os.path.lexists(path):
        require_inside(path, root, f"shard {name}")
    return path


def check_shard_name(name: str, index_path: Path | str) -> None:
    """A shard name the index gives must be a .safetensors file name inside the model directory."""
    if not name or any(ord(c) < 32 for c in name):
        raise InputError(f"{index_path}: shard name {show(name)}; expected a file name")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise InputError(f"{index_path}: shard path {show(name)} leaves the model directory; "
                         "expected a file name inside it")
    if not name.endswith(".safetensors"):
        raise InputError(f"{index_path}: shard {show(name)}; expected a .safetensors file name")


def load_checkpoint(model_dir: Path, root: Path | None = None, library_check: bool = True,
                    remote: dict[str, int] | None = None) -> Checkpoint | None:
    """Load the checkpoint headers of a model dir; None when it has no safetensors files.

    `root` bounds where symlinks may point (the model dir itself, or the repo folder of the
    local Hugging Face cache, whose snapshots link into `blobs/`). `remote`, for a model read from
    a Hub, gives the true size of each safetensors file of the repo, whose header bytes alone are here.
    """
    root = root or model_dir
    if remote is None:
        present = sorted(p.name for p in model_dir.glob("*.safetensors"))
    else:
        present = sorted(name for name in remote if "/" not in name)
    if len(present) > MAX_SHARDS:
        raise InputError(f"{model_dir}: {len(present)} safetensors files, more than the {MAX_SHARDS} accepted")
    for name in present:
        if not is_utf8(name):
            raise InputError(f"{model_dir}: file name {show(name, 300)} is not UTF-8; "
                             "expected names a report can show")
    if os.path.lexists(model_dir / INDEX_NAME):
        return _load_indexed(model_dir, root, present, library_check, remote)
    files = unindexed_files(present)
    if not files:
        return None
    paths = [model_dir / (name + HEADER_SUFFIX if remote is not None else name) for name in files]
    for name, path in zip(files, paths):
        require_inside(path, root, name)
    ckpt = Checkpoint(files=files, tensors={})
    _read_files(ckpt, list(zip(paths, files)), library_check, remote)
    return ckpt


def unindexed_files(present: list[str]) -> list[str]:
    """The files read of a checkpoint without an index: model.safetensors when there, else every
    safetensors file but the `consolidated` ones (Mistral's second copy), else those."""
    if SINGLE_NAME in present:
        return [SINGLE_NAME]
    return [p for p in present if not p.startswith("consolidated")] or present


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The index's weight_map (tensor name -> shard file), checked; at most MAX_SHARDS shards."""
    index, _ = load_json(index_path, "safetensors index", with_lines=False)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise InputError(f"{index_path}: expected an object with a 'weight_map' of tensor name -> shard file")
    if not weight_map:  # vLLM keeps only the shards the index names: "Cannot find any model weights"
        line = load_json(index_path, "safetensors index")[1].get("weight_map")  # only on this error path
        raise InputError(f"{index_path}{f':{line}' if line else ''}: weight_map is empty; expected tensor name -> "
                         "shard file for every tensor (engines that pick shards through the index load none)")
    if set(map(type, weight_map.values())) - {str}:
        name, shard = next((n, s) for n, s in weight_map.items() if not isinstance(s, str))
        raise InputError(f"{index_path}: weight_map[{show(name)}] = {show(shard)}; expected a shard file name")
    shards = set(weight_map.values())
    if len(shards) > MAX_SHARDS:
        raise InputError(f"{index_path}: {len(shards)} shards, more than the {MAX_SHARDS} accepted")
    return weight_map


def _load_indexed(model_dir: Path, root: Path, present: list[str], library_check: bool,
                  remote: dict[str, int] | None) -> Checkpoint:
    """The shards `model.safetensors.index.json` names; missing ones are recorded (CKPT005), not read."""
    index_path = model_dir / INDEX_NAME
    require_inside(index_path, root, INDEX_NAME)
    weight_map = read_weight_map(index_path)
    shards = sorted(set(weight_map.values()))
    paths = {s: _shard_path(model_dir, root, s, index_path, remote is not None) for s in shards}
    missing = [s for s in shards if (s not in remote if remote is not None else not os.path.lexists(paths[s]))]
    extra = [p for p in present if p not in paths and not p.startswith("consolidated")]
    ckpt = Checkpoint(files=[s for s in shards if s not in missing], tensors={}, index_file=INDEX_NAME,
                      missing_shards=missing, extra_shards=extra)
    _read_files(ckpt, [(paths[s], s) for s in ckpt.files], library_check, remote)
    stored_in = list(map(itemgetter(3), ckpt.tensors.values()))  # the file holding each tensor
    if list(map(weight_map.get, ckpt.tensors)) == stored_in:  # the usual case, compared in C: each where mapped
        return ckpt
    stored = dict(zip(ckpt.tensors, stored_in))
    for name in [n for n, s in weight_map.items() if stored.get(n, s) != s][:1]:
        raise InputError(f"{index_path}: tensor {show(name)} is mapped to {weight_map[name]} but stored in "
                         f"{stored[name]}")
    return ckpt


def _read_files(ckpt: Checkpoint, files: list[tuple[Path, str]], library_check: bool,
                remote: dict[str, int] | None = None) -> None:
    """Read every file's header into `ckpt`, within the total header budget.

    The cyclic garbage collector is paused meanwhile: parsing allocates hundreds of thousands of
    small containers, none in a cycle, and its collections would otherwise cost as much as the parse."""
    paused = gc.isenabled()
    gc.disable()
    try:
        _read_all(ckpt, files, library_check, remote)
    finally:
        if paused:
            gc.enable()


def _read_all(ckpt: Checkpoint, files: list[tuple[Path, str]], library_check: bool,
              remote: dict[str, int] | None) -> None:
    left = MAX_TOTAL_HEADER_BYTES
    read: list[dict[str, TensorInfo]] = []
    for path, label in files:
        size = None if remote is None else remote[label]
        tensors, length = read_header(path, label, limit=min(MAX_HEADER_BYTES, left), library_check=library_check,
                                      size=size)
        left -= length
        before = len(ckpt.tensors)
        ckpt.tensors.update(tensors)
        if len(ckpt.tensors) != before + len(tensors):  # a name the files before hold too
            name, earlier = next((n, t) for n in tensors for t in read if n in t)
            raise InputError(f"{path}: tensor {show(name)} is also stored in {earlier[name].file}; "
                             "expected each tensor in one shard")
        read.append(tensors)
        ckpt.total_bytes += os.path.getsize(path) if size is None else size
