"""Where kvdoctor's own data lies: beside this module, which is where a wheel, a checkout and an
editable install all put it (kvdoctor is never imported from a zip). `importlib.resources` would find
the same folder, at the cost of importing zipfile and tempfile on every run.

A wheel carries the catalog as `kvdoctor/rules` (mapped from the repository's `rules/` at build
time); a checkout or an editable install reads `rules/` beside the package.
"""
from __future__ import annotations

from pathlib import Path

from kvdoctor.errors import InputError


def _package() -> Path:
    return Path(__file__).resolve().parent


def catalog_dir() -> Path:
    """The built-in catalog directory (CODE.yaml files)."""
    package = _package()
    for candidate in (package / "rules", package.parent / "rules"):
        if candidate.is_dir():
            return candidate
    raise InputError(f"kvdoctor's catalog directory is missing (looked in {package / 'rules'} and "
                     f"{package.parent / 'rules'}); reinstall kvdoctor")


def data_dir(*parts: str) -> Path:
    """A folder of data shipped inside the package (kvdoctor/data/...)."""
    return _package().joinpath("data", *parts)
