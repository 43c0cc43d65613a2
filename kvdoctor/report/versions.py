"""The engine versions a profile describes against the ones installed here."""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping


@lru_cache(maxsize=None)
def installed(dist: str) -> str | None:
    """The installed version of `dist`, looked up once per process (a report asks for every target).
    importlib.metadata loads only here: its import alone took 16-34 ms on the bench's box, and the
    hf profile, the default, describes no versions to compare."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def differing(described: Mapping[str, str]) -> dict[str, str]:
    """{distribution: installed version} for each one installed at another version than described."""
    out = {}
    for dist, want in described.items():
        have = installed(dist)
        if have is not None and have != want:
            out[dist] = have
    return out


def engine_line(engine: str, described: Mapping[str, str], release: Mapping[str, str] | None = None) -> str:
    """`sglang-mlx: sglang 0.5.23, mlx-lm 0.32.2 (installed: mlx-lm 0.33.0)`; with the release the check
    chose (JSON info.release), why that one: `vllm: vllm 0.31.0 (named by --engine)`."""
    line = engine + (": " + ", ".join(f"{k} {v}" for k, v in described.items()) if described else "")
    if release:
        return f"{line} ({release['why']})"
    other = differing(described)
    if other:
        line += " (installed: " + ", ".join(f"{k} {v}" for k, v in other.items()) + ")"
    return line
