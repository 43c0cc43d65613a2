"""The engines' own Pythons, for `--dry-run`: where kvdoctor finds each, what it holds, and how
`kvdoctor engines install` builds one on a CPU machine.

vLLM's and SGLang's (CUDA) dry runs run a child script in a venv of their own; sglang-mlx's runs in
kvdoctor's own Python. The recipes are those of the goldens' venvs (goldens/setup_venvs.sh): torch
2.13.0 first, then the engine with `--no-deps` (a plain install pulls a CUDA torch and the server's
GPU requirements), then the light requirements its CPU code imports.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from kvdoctor.engines.child import find_python, venvs_dir
from kvdoctor.engines.pins import PINS
from kvdoctor.errors import InputError

TORCH = "torch==2.13.0"  # the CPU build the goldens and the Makefile use


class Recipe(NamedTuple):
    """How one engine's dry run gets its Python."""

    dist: str  # the engine's distribution (its version pin in kvdoctor.engines.pins)
    env_var: str | None  # the variable naming its Python; None: the dry run runs in kvdoctor's own
    no_deps: tuple[str, ...]  # installed with --no-deps after the engine (the engine itself first: "{engine}")
    requires: tuple[str, ...]  # installed with their dependencies


RECIPES: dict[str, Recipe] = {
    "vllm": Recipe("vllm", "KVDOCTOR_VLLM_PYTHON", ("{engine}",), (
        "packaging", "numpy", "regex", "pydantic", "cbor2", "psutil", "pyzmq", "urllib3", "transformers>=5.16.1,<5.21",
        "aiohttp", "requests", "openai-harmony", "openai", "pillow", "pybase64", "cachetools", "msgspec",
        "cloudpickle", "uvloop", "py-cpuinfo", "prometheus_client", "xgrammar==0.2.8", "fastapi>=0.133,<0.137",
        "partial-json-parser", "llguidance>=1.7,<1.8", "einops", "compressed-tensors==0.17.0", "jsonschema",
        "tiktoken", "pydantic-extra-types[pycountry]")),
    "sglang": Recipe("sglang", "KVDOCTOR_SGLANG_PYTHON", (
        "{engine}", "triton==3.7.1", "apache-tvm-ffi==0.1.11", "compressed-tensors", "loguru", "gguf"), (
        "packaging", "numpy", "regex", "pydantic", "psutil", "pyzmq", "requests", "msgspec", "pybase64",
        "transformers>=5.16,<5.21", "aiohttp", "orjson", "einops", "pillow", "python-dateutil", "ipython", "dill",
        "sentencepiece", "starlette", "openai", "openai-harmony", "partial-json-parser")),
    # In kvdoctor's own Python: kvdoctor[sglang] less sglang's own requirements (those of its CUDA server).
    "sglang-mlx": Recipe("sglang", None, ("{engine}",), (
        "mlx[cpu]>=0.32,<1" if sys.platform == "linux" else "mlx>=0.32,<1", f"mlx-lm=={PINS['mlx-lm']}",
        "msgspec>=0.18", "psutil>=5")),
}


# The distributions a kvdoctor extra installs (pyproject.toml's optional-dependencies), the engine first.
EXTRA_DISTS = {"mlx": ("mlx-lm", "mlx")}


def dist_name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name


class Found(NamedTuple):
    """One engine's Python as kvdoctor finds it now."""

    engine: str
    python: Path | None
    source: str  # how it was found: the variable, the venvs folder, or kvdoctor's own Python
    versions: dict[str, str | None]  # distribution -> installed version (None: not installed)

    @property
    def missing(self) -> list[str]:
        return [dist for dist, version in self.versions.items() if version is None]

    @property
    def ready(self) -> bool:
        return self.python is not None and not self.missing


def target_python(engine: str) -> Path:
    """The Python `engines install ENGINE` installs into: kvdoctor's own for sglang-mlx, else the venv
    that find_python looks in."""
    recipe = RECIPES[engine]
    if recipe.env_var is None:
        return Path(sys.executable)
    return venvs_dir() / engine / "bin" / "python"


def find(engine: str, explicit: str | None = None) -> Found:
    recipe = RECIPES[engine]
    if recipe.env_var is None:
        python: Path | None = Path(sys.executable)
        source = "kvdoctor's own Python"
    else:
        python = find_python(explicit, recipe.env_var, engine)
        source = ("--engine-python" if explicit and python == Path(explicit) else
                  f"${recipe.env_var}" if python is not None and os.environ.get(recipe.env_var) == str(python) else
                  f"{venvs_dir()}")
    dists = [recipe.dist, dist_name(TORCH), *(dist_name(r) for r in recipe.requires),
             *(dist_name(r) for r in recipe.no_deps if r != "{engine}")]
    versions = installed_versions(python, dists) if python is not None else dict.fromkeys(dists)
    return Found(engine, python, source, versions)


def find_with_extra(engine: str, extra: str) -> Found:
    """An engine whose dry run runs in kvdoctor's own Python once a pip extra is installed, with no recipe
    here (mlx-lm: kvdoctor[mlx]): the extra's distributions as this Python holds them."""
    python = Path(sys.executable)
    return Found(engine, python, "kvdoctor's own Python", installed_versions(python, list(EXTRA_DISTS[extra])))


QUERY = ("import json, sys\nfrom importlib import metadata\nout = {}\nfor name in sys.argv[1:]:\n"
         "    try:\n        out[name] = metadata.version(name)\n"
         "    except metadata.PackageNotFoundError:\n        out[name] = None\nprint(json.dumps(out))\n")


def installed_versions(python: Path, dists: list[str]) -> dict[str, str | None]:
    """Each distribution's version in that Python (it imports none of them); all None when it does not
    run as a Python."""
    try:
        proc = subprocess.run([str(python), "-I", "-c", QUERY, *dists], capture_output=True, text=True, timeout=60)
        found: dict[str, str | None] = json.loads(proc.stdout)
        return found
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return dict.fromkeys(dists)


def install_commands(engine: str, version: str | None = None, torch_index: str | None = None) -> list[list[str]]:
    """The commands `engines install` runs, in order (a venv first where the engine has its own)."""
    if engine not in RECIPES:
        raise InputError(f"unknown engine {engine!r}; expected one of: {', '.join(RECIPES)}")
    recipe = RECIPES[engine]
    version = version or PINS[recipe.dist]
    _check_version(version)
    python = target_python(engine)
    commands: list[list[str]] = []
    if recipe.env_var is not None and not python.exists():
        commands.append([sys.executable, "-m", "venv", str(python.parent.parent)])
    pip = [str(python), "-m", "pip", "install", "-q"]
    commands.append([*pip, TORCH, *(["--index-url", torch_index] if torch_index else [])])
    commands.append([*pip, "--no-deps", *(r.replace("{engine}", f"{recipe.dist}=={version}") for r in recipe.no_deps)])
    commands.append([*pip, *recipe.requires])
    return commands


def _check_version(version: str) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
    except InvalidVersion:
        raise InputError(f"--version {version!r}: expected a release such as {PINS['vllm']}") from None
