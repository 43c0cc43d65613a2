"""Where kvdoctor's own data lies: found through importlib.resources, so a wheel, a checkout and an
editable install all work.

A wheel carries the catalog as `kvdoctor/rules` (mapped from the repository's `rules/` at build
time); a checkout or an editable install reads `rules/` beside the package.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from kvdoctor.errors import InputError


def _package() -> Path:
    return Path(str(resources.files("kvdoctor")))


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
