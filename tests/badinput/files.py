"""The file system around a model: links in and out, special files, and the Hugging Face cache.

transformers and the engines open whatever path they are given and follow every symlink; a FIFO
blocks them, a socket or a directory makes `open` raise, and a link out of the folder reads another
file. kvdoctor reads regular files only (never blocking), lets links lead anywhere inside the model
directory (or, for the HF cache, inside that model's cache folder, where huggingface_hub stores
`snapshots/<rev>/config.json -> ../../blobs/<hash>`), and refuses the rest in one line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from badinput_base import HF_COMMIT as COMMIT, INDEX, Built, base_model, bind_socket, case, hf_repo, tiny_config


def _link(path: Path, target: str | Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


# --- links inside the model directory: followed, like transformers follows them ------------------------
@case("files", "config-link-into-subdir")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "sub").mkdir()
    (m / "config.json").rename(m / "sub" / "real.json")
    _link(m / "config.json", "sub/real.json")
    return Built(str(m), m, None)


@case("files", "config-absolute-link-inside")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").rename(m / "real.json")
    _link(m / "config.json", m / "real.json")
    return Built(str(m), m, None)


@case("files", "shard-link-chain-inside")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "model.safetensors").rename(m / "c.bin")
    _link(m / "b.link", "c.bin")
    _link(m / "model.safetensors", "b.link")
    return Built(str(m), m, None)


@case("files", "link-out-and-back-in")
def _(tmp: Path) -> Built:
    """config.json -> ../hop/x -> ../model/real.json: it resolves inside the model directory."""
    m = base_model(tmp)
    (tmp / "hop").mkdir()
    (m / "config.json").rename(m / "real.json")
    _link(tmp / "hop" / "x", "../model/real.json")
    _link(m / "config.json", "../hop/x")
    return Built(str(m), m, None)


@case("files", "model-dir-is-a-link")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (tmp / "alias").symlink_to(m)  # the user named the link: its target is the model directory
    return Built(str(tmp / "alias"), m, None)


@case("files", "target-with-trailing-slash")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    return Built(str(m) + "/", m, None)


@case("files", "target-with-dotdot")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (tmp / "side").mkdir()
    return Built(str(tmp / "side" / ".." / "model"), m, None)


@case("files", "hardlinked-config")
def _(tmp: Path) -> Built:
    """A hard link is the file itself: nothing to refuse."""
    m = base_model(tmp)
    (tmp / "shared.json").write_text(json.dumps(tiny_config()))
    (m / "config.json").unlink()
    os.link(tmp / "shared.json", m / "config.json")
    return Built(str(m), m, None)


@case("files", "unrelated-broken-links")
def _(tmp: Path) -> Built:
    """Files kvdoctor never reads may be anything (transformers would not read them either)."""
    m = base_model(tmp)
    _link(m / "tokenizer.json", "gone.json")
    _link(m / "loop.txt", "loop.txt")
    _link(m / "passwd", "/etc/passwd")
    os.mkfifo(m / "README.md")
    return Built(str(m), m, None)


# --- links out: refused (transformers would read the other file) ----------------------------------------
for _name, _target in [("config.json", "/etc/passwd"), ("config.json", "/proc/self/environ"),
                       ("config.json", "/dev/null"), ("model.safetensors", "/dev/zero"),
                       ("model.safetensors", "/proc/self/mem"), ("config.json", "/")]:
    def _out(tmp: Path, name=_name, target=_target) -> Built:
        m = base_model(tmp)
        _link(m / name, target)
        return Built(str(m), m, name)
    case("files", f"{_name.split('.')[0]}-link-to-{_target.strip('/').replace('/', '-') or 'root'}")(_out)


@case("files", "config-relative-link-out")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (tmp / "other.json").write_text(json.dumps(tiny_config()))
    _link(m / "config.json", "../other.json")
    return Built(str(m), m, "config.json")


@case("files", "shard-link-to-sibling-model")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    other = base_model(tmp / "sibling")
    _link(m / "model.safetensors", other / "model.safetensors")
    return Built(str(m), m, "model.safetensors")


@case("files", "index-link-to-outside-dir")
def _(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    (tmp / "idx").mkdir()
    (m / INDEX).rename(tmp / "idx" / INDEX)
    _link(m / INDEX, tmp / "idx" / INDEX)
    return Built(str(m), m, INDEX)


# --- special files where a file belongs: a FIFO would block transformers' open(); refused at once -------
for _name in ("config.json", "model.safetensors", INDEX):
    def _special(tmp: Path, name=_name, kind="fifo") -> Built:
        m = base_model(tmp, shards=2 if name == INDEX else 1)
        (m / name).unlink()
        if kind == "fifo":
            os.mkfifo(m / name)
        elif kind == "socket":
            bind_socket(m / name)
        else:
            (m / name).mkdir()
        return Built(str(m), m, name)
    _short = {"config.json": "config", "model.safetensors": "shard", INDEX: "index"}[_name]
    if _name == INDEX:
        case("files", f"{_short}-fifo")(_special)
    case("files", f"{_short}-socket")(lambda tmp, f=_special: f(tmp, kind="socket"))
    if _name == INDEX:
        case("files", f"{_short}-directory")(lambda tmp, f=_special: f(tmp, kind="dir"))


@case("files", "indexed-shard-socket")
def _(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    shard = sorted(m.glob("*.safetensors"))[1]
    shard.unlink()
    bind_socket(shard)
    return Built(str(m), m, shard.name)


@case("files", "indexed-shard-directory")
def _(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    shard = sorted(m.glob("*.safetensors"))[0]
    shard.unlink()
    shard.mkdir()
    return Built(str(m), m, shard.name)


@case("files", "indexed-shard-dangling-link")
def _(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    shard = sorted(m.glob("*.safetensors"))[0]
    _link(shard, "nowhere.safetensors")
    return Built(str(m), m, shard.name)


@case("files", "target-is-fifo")
def _(tmp: Path) -> Built:
    os.mkfifo(tmp / "model")
    return Built(str(tmp / "model"), tmp, "model")


@case("files", "target-is-socket")
def _(tmp: Path) -> Built:
    bind_socket(tmp / "model")
    return Built(str(tmp / "model"), tmp, "model")


@case("files", "target-dangling-link")
def _(tmp: Path) -> Built:
    (tmp / "model").symlink_to("gone")
    return Built(str(tmp / "model"), tmp, "model")


@case("files", "config-empty-file")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    (m / "config.json").write_bytes(b"")  # json.loads(""): "Expecting value"
    return Built(str(m), m, "config.json")


@case("files", "config-sparse-16mib-plus-one")
def _(tmp: Path) -> Built:
    m = base_model(tmp)
    with (m / "config.json").open("r+b") as fh:
        fh.truncate(16 * 1024 * 1024 + 1)  # one byte past the bound: refused before a byte is read
    return Built(str(m), m, "config.json")


@case("files", "index-sparse-huge")
def _(tmp: Path) -> Built:
    m = base_model(tmp, shards=2)
    with (m / INDEX).open("r+b") as fh:
        fh.truncate(1 << 40)  # a 1 TiB hole
    return Built(str(m), m, INDEX)


# --- the Hugging Face cache: its own links must keep working ------------------------------------------
def _cache(tmp: Path, shards: int = 1) -> tuple[Path, Path, Path]:
    """(cache, repo folder, snapshot folder), laid out as huggingface_hub lays it out."""
    cache, repo = hf_repo(tmp, shards=shards)
    return cache, repo, repo / "snapshots" / COMMIT


def _env(cache: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(cache)}


@case("cache", "sharded-by-id")
def _(tmp: Path) -> Built:
    cache, repo, _ = _cache(tmp, shards=2)  # index and shards all ../../blobs links
    return Built("acme/tiny", repo, None, env=_env(cache))


@case("cache", "sharded-snapshot-path")
def _(tmp: Path) -> Built:
    _, repo, snap = _cache(tmp, shards=2)
    return Built(str(snap), repo, None)


@case("cache", "by-hf-home")
def _(tmp: Path) -> Built:
    """HF_HOME/hub is the cache when HF_HUB_CACHE is unset (huggingface_hub's constants)."""
    cache, repo, _ = _cache(tmp)
    return Built("acme/tiny", repo, None, env={"HF_HOME": str(cache.parent), "HF_HUB_CACHE": ""})


@case("cache", "ref-with-newline")
def _(tmp: Path) -> Built:
    cache, repo, _ = _cache(tmp)
    (repo / "refs" / "main").write_text(COMMIT + "\n")  # written by hand: huggingface_hub strips it too
    return Built("acme/tiny", repo, None, env=_env(cache))


@case("cache", "ref-empty")
def _(tmp: Path) -> Built:
    cache, repo, _ = _cache(tmp)
    (repo / "refs" / "main").write_text("")
    return Built("acme/tiny", repo, "refs/main", env=_env(cache))


@case("cache", "ref-to-missing-snapshot")
def _(tmp: Path) -> Built:
    cache, repo, _ = _cache(tmp)
    (repo / "refs" / "main").write_text("f" * 40)
    return Built("acme/tiny", repo, "snapshot", env=_env(cache))


@case("cache", "ref-is-fifo")
def _(tmp: Path) -> Built:
    """huggingface_hub would block opening it; kvdoctor never opens a FIFO, treats the ref as absent
    and takes the newest snapshot, as it does without refs/main: a clean pass, no hang."""
    cache, repo, _ = _cache(tmp)
    (repo / "refs" / "main").unlink()
    os.mkfifo(repo / "refs" / "main")
    return Built("acme/tiny", repo, None, env=_env(cache))


@case("cache", "blob-link-to-other-repo")
def _(tmp: Path) -> Built:
    """A snapshot link into another model's blobs leaves this model's cache folder."""
    cache, repo, snap = _cache(tmp)
    other = cache / "models--evil--x" / "blobs"
    other.mkdir(parents=True)
    (other / "cfg").write_text(json.dumps(tiny_config()))
    _link(snap / "config.json", os.path.relpath(other / "cfg", snap))
    return Built("acme/tiny", repo, "config.json", env=_env(cache))


@case("cache", "blob-is-fifo")
def _(tmp: Path) -> Built:
    cache, repo, snap = _cache(tmp)
    blob = (snap / "config.json").resolve()
    blob.unlink()
    os.mkfifo(blob)
    return Built("acme/tiny", repo, "config.json", env=_env(cache))


@case("cache", "blob-missing")
def _(tmp: Path) -> Built:
    cache, repo, snap = _cache(tmp)
    (snap / "model.safetensors").resolve().unlink()  # an interrupted download
    return Built("acme/tiny", repo, "model.safetensors", env=_env(cache))


@case("cache", "snapshot-folder-links-out")
def _(tmp: Path) -> Built:
    cache, repo, snap = _cache(tmp)
    elsewhere = tmp / "elsewhere"
    snap.rename(elsewhere)
    snap.symlink_to(elsewhere)
    return Built("acme/tiny", repo, "snapshot", env=_env(cache))


@case("cache", "id-with-dotdot")
def _(tmp: Path) -> Built:
    cache, repo, _ = _cache(tmp)
    return Built("acme/../../etc", repo, "acme/../../etc", env=_env(cache))


@case("cache", "id-three-parts")
def _(tmp: Path) -> Built:
    cache, repo, _ = _cache(tmp)
    return Built("acme/tiny/extra", repo, "acme/tiny/extra", env=_env(cache))


@case("cache", "cache-dir-is-file")
def _(tmp: Path) -> Built:
    (tmp / "hub").write_text("not a folder")
    return Built("acme/tiny", tmp, "acme/tiny", env=_env(tmp / "hub"))


@case("cache", "legacy-helper-still-loads")
def _(tmp: Path) -> Built:
    cache, repo = hf_repo(tmp, "acme/legacy")
    return Built("acme/legacy", repo, None, env=_env(cache))
