"""What the hostile-input corpus shares (tests/badinput_gen.py and tests/badinput/): the case registry,
the healthy base model, and builders for raw files, headers, deploy files and the HF cache layout.

A case builds its input under a temporary directory and returns a `Built` saying what the check must
end in: an input error (exit 2) whose one line names `names`, or a named finding.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from helpers import make_model, real_config


@dataclass
class Built:
    """What one built case asks of a check."""

    target: str
    model_dir: Path  # must hash the same before and after the check
    names: str | None  # the error line must contain this; None when a finding or a pass is expected
    code: str | None = None  # the finding expected (when `names` is None); both None: a clean pass
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] | None = None  # the whole command line, in place of `check --format json TARGET ARGS`
    marker: Path | None = None  # code-execution bait: this file exists only if model code ran
    accepted: bool = False  # with `names` and `code` None: no input error (exit 0 or 1); else a clean pass


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    build: Callable[[Path], Built]


CASES: list[Case] = []


def case(kind: str, id: str):
    def register(fn: Callable[[Path], Built]) -> Callable[[Path], Built]:
        CASES.append(Case(f"{kind}-{id}", kind, fn))
        return fn
    return register


# --- the healthy base ------------------------------------------------------------------------------

def tiny_config() -> dict[str, Any]:
    """Llama-3.1-8B's real config.json, scaled down so its checkpoint is a few kilobytes."""
    cfg = real_config("llama-3.1-8b")
    cfg.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=256)
    return cfg


def base_model(tmp: Path, shards: int = 1, checkpoint: bool = True) -> Path:
    return make_model(tmp, tiny_config(), checkpoint=checkpoint, shards=shards, dirname="model")


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything a write would change under `root`: names, types, modes, sizes, mtimes, ctimes,
    link targets, and the content hash of every regular file up to 8 MiB (larger ones are sparse
    checkpoints whose data is never read; their ctime and mtime still catch a write)."""
    state: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames + [""]:
            p = Path(dirpath) / name
            st = p.lstat()
            entry: tuple = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(p),)
            elif stat.S_ISREG(st.st_mode) and st.st_size <= 8 * 1024 * 1024:
                entry += (hashlib.sha256(p.read_bytes()).hexdigest(),)
            state[str(p.relative_to(root))] = entry
    return state


def st_bytes(header: dict | None, data: int = 0, raw: bytes | None = None) -> bytes:
    """A safetensors file: 8-byte little-endian header length, the header, `data` zero bytes."""
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * data


ONE = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


INDEX = "model.safetensors.index.json"


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


def config_case(kind: str, id: str, content: bytes | str, ok: bool = False) -> None:
    """The healthy model with config.json replaced by `content`: refused naming config.json, or `ok`."""
    @case(kind, id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp)
        (m / "config.json").write_bytes(content.encode() if isinstance(content, str) else content)
        return Built(str(m), m, None if ok else "config.json")


def deploy_case(id: str, text: bytes | str, names: str | None = "deploy.yaml", accepted: bool = False) -> None:
    """The healthy model with `--deploy` a file holding `text`: refused naming `names`, or `accepted`."""
    @case("deploy", id)
    def build(tmp: Path) -> Built:
        m = base_model(tmp)
        path = tmp / "deploy.yaml"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        return Built(str(m), m, None if accepted else names, args=("--deploy", str(path)), accepted=accepted)


# --- the local Hugging Face cache -------------------------------------------------------------------

HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the snapshot hf_repo lays out


def hf_repo(tmp: Path, repo_id: str = "acme/tiny", shards: int = 1) -> tuple[Path, Path]:
    """A cache laid out as huggingface_hub lays it out: snapshot files are links into blobs/."""
    cache = tmp / "hub"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    built = base_model(tmp / "src", shards=shards)
    commit = HF_COMMIT
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in built.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.name.encode()).hexdigest()
        f.rename(blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return cache, repo


def healthy_cached_model(tmp: Path) -> tuple[str, Path, dict[str, str]]:
    """A legitimate cache entry (snapshot links into ../../blobs): it must load."""
    cache, repo = hf_repo(tmp)
    return "acme/tiny", repo, {"HF_HUB_CACHE": str(cache)}


