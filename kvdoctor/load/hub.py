"""A model on a Hugging Face Hub (or a mirror), read without its weights, through huggingface_hub.

One revision is resolved to its commit (the model-info API, which also lists the files and their
true sizes), then config.json and the safetensors index are downloaded by the client and each
shard's header is read by HTTP range requests made with the client's session, token, retries and
URLs (`hf_hub_url`): its endpoint (HF_ENDPOINT), token (HF_TOKEN) and offline switch hold throughout.
The client's own header reader (`HfApi.parse_safetensors_file_metadata`) returns the header parsed
and not its bytes; kvdoctor's checks of a header read its bytes (a name given twice, non-UTF-8 text,
its own bounds), so the bytes are fetched and kept.

Everything lands in kvdoctor's own cache (`cache_root()`), in the Hub cache's layout:
`models--ORG--NAME/` with `blobs/`, `refs/REVISION` and `snapshots/COMMIT/`. A shard's header is
kept as `NAME.safetensors.header` and the shard's true size in `MANIFEST`, never as a truncated
`NAME.safetensors` that a tool reading the Hugging Face cache would take for the weights. The
manifest is written last: a snapshot with one is complete, and a later run (offline too) reads it
without a request.
"""
from __future__ import annotations

import json
import os
import re
import struct
import time
from pathlib import Path

import msgspec

from kvdoctor.errors import InputError
from kvdoctor.load.checkpoint import (HEADER_SUFFIX, INDEX_NAME, check_shard_name, read_weight_map,
                                      unindexed_files)
from kvdoctor.load.jsonfile import read_bounded, show
from kvdoctor.limits import MAX_HEADER_BYTES, MAX_JSON_BYTES, MAX_SHARDS, MAX_TOTAL_HEADER_BYTES

MANIFEST = "kvdoctor-hub.json"
CONFIG_NAME = "config.json"
# The first range read of a shard: most headers fit (one request); a longer one takes a second.
FIRST_READ = 64 * 1024
REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}$")
COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # what huggingface_hub reads as true in HF_HUB_OFFLINE


class Fetched(msgspec.Struct):
    """A Hub revision's metadata in kvdoctor's cache: where it is and what reading it cost."""

    model_dir: Path  # snapshots/COMMIT
    root: Path  # models--ORG--NAME: symlinks of the snapshot point into its blobs/
    commit: str
    sizes: dict[str, int]  # every safetensors file of the repo: its true size
    fetched_bytes: int = 0
    seconds: float = 0.0
    cached: bool = False  # read from kvdoctor's cache: nothing fetched but the revision's commit


def offline() -> bool:
    return (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper() in TRUE_VALUES


def cache_root() -> Path:
    """kvdoctor's own Hub cache: $KVDOCTOR_HUB_CACHE, else `kvdoctor/` under HF_HOME."""
    if os.environ.get("KVDOCTOR_HUB_CACHE"):
        return Path(os.environ["KVDOCTOR_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "kvdoctor"


def check_revision(target: str, revision: str) -> None:
    if not REVISION.match(revision) or ".." in revision:
        raise InputError(f"{target}: revision {show(revision)}; expected a branch, tag or commit hash "
                         "(letters, digits, '.', '_', '-', '/')")


def fetch(repo_id: str, revision: str | None) -> Fetched:
    """The metadata of `repo_id` at `revision` (default: main), from kvdoctor's cache or the Hub."""
    began = time.perf_counter()
    repo_dir = cache_root() / ("models--" + repo_id.replace("/", "--"))
    label = f"{repo_id}@{revision}" if revision else repo_id
    if offline() or (revision is not None and COMMIT_HASH.match(revision)):  # a commit never changes
        found = _complete(repo_dir, _cached_commit(repo_dir, revision or "main"))
        if found is not None:
            found.cached = True
            return found
    if offline():
        raise InputError(f"{label}: not in the local Hugging Face cache nor fetched before into {cache_root()}, "
                         "and offline (--offline or HF_HUB_OFFLINE=1): kvdoctor fetches nothing")
    import httpx2
    from huggingface_hub.errors import EntryNotFoundError

    try:
        fetched = _fetch(repo_id, revision, repo_dir, label)
    except (OSError, ValueError, KeyError, httpx2.HTTPError, EntryNotFoundError) as exc:
        # The client's errors (its HTTP errors are OSErrors, a malformed id a ValueError), a server's
        # malformed answer, the network's: each is one line (exit 2).
        raise InputError(_why(label, exc)) from None
    fetched.seconds = time.perf_counter() - began
    return fetched


def _why(label: str, exc: Exception) -> str:
    """One line for an error huggingface_hub raised."""
    from huggingface_hub import constants, errors

    where = constants.ENDPOINT
    if isinstance(exc, errors.GatedRepoError):
        return (f"{label}: the repository is gated on {where} and this token has no access; accept its terms "
                "on the Hub, then set HF_TOKEN")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (f"{label}: no such repository on {where}, or it is private and no token grants access "
                "(set HF_TOKEN)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{label}: no such revision on {where}; expected a branch, tag or commit of the repository"
    if isinstance(exc, errors.EntryNotFoundError):
        return f"{label}: a file the repository lists is missing on {where}"
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return f"{label}: offline (HF_HUB_OFFLINE=1): kvdoctor fetches nothing"
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status == 429:
            return (f"{label}: {where} answered 429 Too Many Requests (rate limit); wait and retry, or set "
                    "HF_TOKEN for a higher limit")
        return f"{label}: {where} answered {status} {exc.response.reason_phrase}"
    text = " ".join(str(exc).split())[:300]
    return f"{label}: cannot read the repository from {where}: {type(exc).__name__}: {text}"


def _fetch(repo_id: str, revision: str | None, repo_dir: Path, label: str) -> Fetched:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    commit = info.sha or ""
    if not COMMIT_HASH.match(commit):
        raise InputError(f"{label}: the Hub gave commit {show(commit)}; expected 40 hexadecimal digits")
    label = f"{repo_id}@{commit[:12]}"
    found = _complete(repo_dir, commit)
    if found is not None:  # fetched before: nothing more to read
        found.cached = True
        _write_ref(repo_dir, revision or "main", commit)
        return found
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    _require_files(label, sizes)
    for name in (CONFIG_NAME, INDEX_NAME):
        size = sizes.get(name)
        if size is not None and size > MAX_JSON_BYTES:
            raise InputError(f"{label}: {name} is {size} bytes on the Hub; at most {MAX_JSON_BYTES} are accepted")
    got = Fetched(model_dir=repo_dir / "snapshots" / commit, root=repo_dir, commit=commit, sizes={})
    _download(repo_id, CONFIG_NAME, commit, got)
    wanted = _wanted_shards(repo_id, commit, sizes, got, label)
    weights = {name: size for name, size in sizes.items() if name.endswith(".safetensors")}
    if any(size is None for size in weights.values()):
        raise InputError(f"{label}: the Hub listed the safetensors files without their sizes")
    got.sizes = {name: int(size) for name, size in weights.items() if size is not None}
    left = MAX_TOTAL_HEADER_BYTES
    for name in wanted:
        header = _read_header(repo_id, commit, name, got.sizes[name], min(MAX_HEADER_BYTES, left), got, label)
        left -= len(header) - 8
        _write(got.model_dir / (name + HEADER_SUFFIX), header)
    manifest = {"repo": repo_id, "commit": commit, "sizes": got.sizes}
    _write(got.model_dir / MANIFEST, json.dumps(manifest, indent=1).encode())
    _write_ref(repo_dir, revision or "main", commit)
    return got


def _require_files(label: str, sizes: dict[str, int | None]) -> None:
    """A repo kvdoctor can read has config.json and safetensors weights; say what it has instead."""
    weights = [n for n in sizes if n.endswith(".safetensors")]
    if CONFIG_NAME in sizes and weights:
        return
    others = sorted(n for n in sizes if n.rpartition(".")[2] in ("gguf", "bin", "pt", "pth", "ckpt", "h5", "msgpack"))
    found = f" (weights: {', '.join(others[:4])}{', ...' if len(others) > 4 else ''})" if others else ""
    missing = " and ".join(what for what, absent in (("no config.json", CONFIG_NAME not in sizes),
                                                     ("no safetensors files", not weights)) if absent)
    raise InputError(f"{label}: {missing} on the Hub{found}; kvdoctor reads config.json and safetensors headers only")


def _wanted_shards(repo_id: str, commit: str, sizes: dict[str, int | None], got: Fetched, label: str) -> list[str]:
    """The shards whose headers the checkpoint reader reads: those the index names and the repo has,
    else the files it reads without an index."""
    if INDEX_NAME not in sizes:
        return unindexed_files(sorted(n for n in sizes if n.endswith(".safetensors") and "/" not in n))
    index = _download(repo_id, INDEX_NAME, commit, got)
    shards = sorted(set(read_weight_map(index).values()))
    for name in shards:
        check_shard_name(name, f"{label}/{INDEX_NAME}")
    if len(shards) > MAX_SHARDS:
        raise InputError(f"{label}: {len(shards)} shards, more than the {MAX_SHARDS} accepted")
    return [name for name in shards if name in sizes]


def _download(repo_id: str, name: str, commit: str, got: Fetched) -> Path:
    """A small file of the revision, downloaded by the client into kvdoctor's cache."""
    from huggingface_hub import hf_hub_download

    path = Path(hf_hub_download(repo_id, name, revision=commit, cache_dir=cache_root()))
    got.fetched_bytes += path.stat().st_size
    return path


def _read_header(repo_id: str, commit: str, name: str, size: int, limit: int, got: Fetched, label: str) -> bytes:
    """A shard's 8-byte length and header, by one range request (two for a header past FIRST_READ)."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, name, revision=commit)
    where = f"{label}/{name}"
    if size < 8:
        raise InputError(f"{where}: truncated safetensors file: {size} bytes on the Hub; expected an 8-byte "
                         "header length at byte 0")
    head = _range(url, 0, min(FIRST_READ, size), size, got, where)
    (length,) = struct.unpack("<Q", head[:8])
    if length > limit:
        raise InputError(f"{where}: safetensors header length {length} at byte 0 exceeds the {limit}-byte bound "
                         f"(at most {MAX_HEADER_BYTES} a file and {MAX_TOTAL_HEADER_BYTES} a checkpoint)")
    if 8 + length > size:
        raise InputError(f"{where}: truncated safetensors header: the length at byte 0 says {length} bytes but "
                         f"the file has {size - 8} after byte 8")
    if 8 + length > len(head):
        head += _range(url, len(head), 8 + length, size, got, where)
    return head[:8 + length]


def _range(url: str, start: int, stop: int, size: int, got: Fetched, where: str) -> bytes:
    """Bytes start..stop-1 of a file of `size` bytes, streamed so that a server ignoring the range
    sends no more than asked for."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

    headers = {**build_hf_headers(), "Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
    body = bytearray()
    with http_stream_backoff("GET", url, headers=headers) as response:
        if response.status_code >= 400:
            response.read()
        hf_raise_for_status(response)
        if response.status_code != 206 and start > 0:
            raise InputError(f"{where}: the Hub ignored the range request for bytes {start}..{stop - 1} "
                             f"(answered {response.status_code}); expected 206 Partial Content")
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total.isdigit() and int(total) != size:
            raise InputError(f"{where}: the Hub says the file has {total} bytes here and {size} in its file list; "
                             "expected one size")
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) >= stop - start:
                break
    got.fetched_bytes += len(body)
    if len(body) < stop - start:
        raise InputError(f"{where}: truncated range: the Hub sent {len(body)} bytes for bytes {start}..{stop - 1} "
                         f"of a {size}-byte file; expected {stop - start}")
    return bytes(body[:stop - start])


def _cached_commit(repo_dir: Path, revision: str) -> str | None:
    """The commit a revision named in kvdoctor's cache: its ref, or the revision itself when a snapshot."""
    ref = repo_dir / "refs" / revision
    if ref.is_file():
        commit = read_bounded(ref, 256, "kvdoctor Hub cache ref").decode("utf-8", "replace").strip()
        return commit if COMMIT_HASH.match(commit) else None
    return revision if COMMIT_HASH.match(revision) else None


def _complete(repo_dir: Path, commit: str | None) -> Fetched | None:
    """A snapshot fetched in full before (its manifest written), or None."""
    if commit is None:
        return None
    snapshot = repo_dir / "snapshots" / commit
    if not (snapshot / MANIFEST).is_file():
        return None
    try:
        manifest = json.loads(read_bounded(snapshot / MANIFEST, MAX_JSON_BYTES, "kvdoctor Hub manifest"))
    except ValueError:
        manifest = None
    sizes = manifest.get("sizes") if isinstance(manifest, dict) else None
    if not isinstance(sizes, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()):
        raise InputError(f"{snapshot / MANIFEST}: expected {{'sizes': {{file: bytes}}}}; delete the folder to refetch")
    return Fetched(model_dir=snapshot, root=repo_dir, commit=commit, sizes=sizes)


def _write_ref(repo_dir: Path, revision: str, commit: str) -> None:
    if revision != commit:
        _write(repo_dir / "refs" / revision, commit.encode())


def _write(path: Path, data: bytes) -> None:
    """Write a file whole or not at all (a run cut short leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
