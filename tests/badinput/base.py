"""What the corpus modules share: the case registry and builders for model dirs, raw files and headers.

A case builds its input under a temporary directory and returns a `Built` (tests/badinput_gen.py)
saying what the check must end in. Every case carries a comment saying what transformers or the
engine does with the same input: that is why its expected outcome is what it is.
"""
from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from typing import Callable

from badinput_gen import Built, Case, base_model, tiny_config

CASES: list[Case] = []


def case(kind: str, id: str):
    def register(fn: Callable[[Path], Built]) -> Callable[[Path], Built]:
        CASES.append(Case(f"{kind}-{id}", kind, fn))
        return fn
    return register


def model(tmp: Path, shards: int = 1, checkpoint: bool = True) -> Path:
    return base_model(tmp, shards=shards, checkpoint=checkpoint)


def config_text(**changes) -> str:
    cfg = tiny_config()
    cfg.update(changes)
    return json.dumps(cfg, indent=2)


def read_header(path: Path) -> tuple[dict, int]:
    """(header, data bytes) of a safetensors file that kvdoctor's synth wrote."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), len(raw) - 8 - n


def write_header(path: Path, header: dict | bytes, data: int, length: int | None = None) -> None:
    """A safetensors file: the 8-byte length (or `length`), the header, `data` bytes of hole."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(text) if length is None else length) + text)
        fh.truncate(8 + len(text) + data)


def bind_socket(path: Path) -> None:
    """A Unix socket at `path` (bound from its folder: socket paths are limited to 108 bytes)."""
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.close()  # the socket file stays; nothing listens
    finally:
        os.chdir(here)
