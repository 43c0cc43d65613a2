"""Safetensors checkpoints, headers only.

Each file's 8-byte length prefix is checked against a bound and the file size before anything else
is read; the header is then parsed (duplicate names refused) and the file is opened with the
safetensors library, which validates offsets, dtypes and byte spans. Tensor data is never read.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from kvdoctor.errors import InputError
from kvdoctor.jsonfile import load_json
from kvdoctor.model import Checkpoint, TensorInfo

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own bound
MAX_SHARDS = 4096

# Bits per element of every safetensors dtype.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E5M2", "F8_E4M3"}


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate tensor name {key!r}")
        seen[key] = value
    return seen


def read_header(path: Path, label: str) -> dict[str, TensorInfo]:
    """Read one safetensors header: {name: TensorInfo}. Raises InputError on anything malformed."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise InputError(f"{path}: truncated safetensors file: {len(prefix)} bytes, the 8-byte header length is missing")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise InputError(f"{path}: safetensors header length {length} at byte 0 exceeds the {MAX_HEADER_BYTES}-byte bound")
            if 8 + length > size:
                raise InputError(f"{path}: truncated safetensors header: length prefix says {length} bytes but the file has {size - 8} after byte 8")
            raw = fh.read(length)
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"{path}: cannot read safetensors file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: safetensors header is not UTF-8 (byte offset {8 + exc.start})") from None
    try:
        header = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except RecursionError:
        raise InputError(f"{path}: safetensors header nests too deeply") from None
    except ValueError as exc:
        raise InputError(f"{path}: safetensors header (bytes 8..{8 + length}) is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header must be a JSON object, got {type(header).__name__}")
    _validate_with_library(path)
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            raise InputError(f"{path}: tensor {name!r}: header entry must have 'dtype', 'shape' and 'data_offsets'")
        tensors[name] = TensorInfo(name, str(entry.get("dtype")), tuple(int(d) for d in entry["shape"]), label)
    return tensors


def _validate_with_library(path: Path) -> None:
    """Let the safetensors library check offsets, dtypes and byte spans (it maps, never reads data)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except SafetensorError as exc:
        raise InputError(f"{path}: invalid safetensors header: {exc}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: invalid safetensors file: {exc}") from None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except (ValueError, OSError, RuntimeError):
        return False


def _shard_path(model_dir: Path, root: Path, name: object, index_path: Path) -> Path:
    if not isinstance(name, str) or not name:
        raise InputError(f"{index_path}: weight_map values must be shard file names, got {name!r}")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise InputError(f"{index_path}: shard path {name!r} leaves the model directory; expected a file name inside it")
    path = model_dir / rel
    if path.exists() and not _inside(path, root):
        raise InputError(f"{index_path}: shard {name!r} resolves outside the model directory")
    return path


def load_checkpoint(model_dir: Path, root: Path | None = None) -> Checkpoint | None:
    """Load the checkpoint headers of a model dir; None when it has no safetensors files.

    `root` bounds where symlinks may point (the model dir itself, or the repo folder of the
    local Hugging Face cache, whose snapshots link into `blobs/`).
    """
    root = root or model_dir
    index_path = model_dir / INDEX_NAME
    present = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if index_path.exists():
        index, _ = load_json(index_path, "safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise InputError(f"{index_path}: expected an object with a 'weight_map' of tensor name -> shard file")
        shards = sorted(set(map(str, weight_map.values())))
        if len(shards) > MAX_SHARDS:
            raise InputError(f"{index_path}: {len(shards)} shards, more than the {MAX_SHARDS} accepted")
        paths = {s: _shard_path(model_dir, root, s, index_path) for s in shards}
        missing = [s for s in shards if not paths[s].is_file()]
        extra = [p for p in present if p not in paths and not p.startswith("consolidated")]
        ckpt = Checkpoint(files=[s for s in shards if s not in missing], tensors={}, index_file=INDEX_NAME,
                          missing_shards=missing, extra_shards=extra)
        for shard in ckpt.files:
            _add_file(ckpt, paths[shard], shard, root)
        for name, shard in weight_map.items():
            info = ckpt.tensors.get(name)
            if info is not None and info.file != shard:
                raise InputError(f"{index_path}: tensor {name!r} is mapped to {shard} but stored in {info.file}")
        return ckpt
    if SINGLE_NAME in present:
        files = [SINGLE_NAME]
    else:
        files = [p for p in present if not p.startswith("consolidated")] or present
    if not files:
        return None
    ckpt = Checkpoint(files=files, tensors={})
    for name in files:
        _add_file(ckpt, model_dir / name, name, root)
    return ckpt


def _add_file(ckpt: Checkpoint, path: Path, label: str, root: Path) -> None:
    if not _inside(path, root):
        raise InputError(f"{path}: resolves outside the model directory")
    for name, info in read_header(path, label).items():
        if name in ckpt.tensors:
            raise InputError(f"{path}: tensor {name!r} is also stored in {ckpt.tensors[name].file}; expected each tensor in one shard")
        ckpt.tensors[name] = info
    ckpt.total_bytes += os.path.getsize(path)
