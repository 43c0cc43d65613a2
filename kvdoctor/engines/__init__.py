"""Engine profiles, by name, each imported only when it is asked for (as `report/` does for formats).

Adding an engine is one module with an `EngineProfile` subclass and one line here. The order is the
order of `kvdoctor budget`'s table.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

from kvdoctor.engines.base import EngineProfile
from kvdoctor.errors import InputError

PROFILES: dict[str, str] = {
    "hf": "kvdoctor.engines.hf:HfProfile",
    "vllm": "kvdoctor.engines.vllm.profile:VllmProfile",
    "sglang": "kvdoctor.engines.sglang.profile:SglangProfile",
    "sglang-mlx": "kvdoctor.engines.sglang_mlx.profile:SglangMlxProfile",
    "mlx-lm": "kvdoctor.engines.mlx_lm.profile:MlxLmProfile",
}


def section_name(engine: str) -> str:
    """The deploy-file section of a profile: its name with - as _ (`sglang-mlx` -> `sglang_mlx`)."""
    return engine.replace("-", "_")


@lru_cache(maxsize=None)
def profile_class(name: str) -> type[EngineProfile]:
    module, _, cls = PROFILES[name].partition(":")
    found: type[EngineProfile] = getattr(importlib.import_module(module), cls)
    return found


@lru_cache(maxsize=None)
def profile(name: str) -> EngineProfile:
    return profile_class(name)()


def check_engines() -> list[str]:
    """Profiles `kvdoctor check --engine` accepts: those with a layout plan."""
    return [name for name in PROFILES if profile_class(name).can_plan()]


def is_check_engine(name: str) -> bool:
    """`name in check_engines()`, importing only that profile's module."""
    return name in PROFILES and profile_class(name).can_plan()


def budget_engines() -> list[str]:
    """Profiles `kvdoctor budget` sizes, in table order."""
    return [name for name in PROFILES if profile_class(name).can_budget()]


def fit_engines() -> list[str]:
    """Profiles `kvdoctor fit` models: weights per rank, the engine's reservations, its KV plan."""
    return [name for name in PROFILES if profile_class(name).can_fit()]


def is_reference(name: str) -> bool:
    """The profile is the model's own meaning (hf), not a serving engine: a report shows no engine row."""
    return name in PROFILES and profile_class(name).reference


def require_extras(engine: str, static: bool, dry_run: bool) -> None:
    """MissingExtra (one line naming the pip extra) when `check --engine ENGINE` with these options needs
    a package that is absent: what the profile declares its probes and its in-process dry run need."""
    from kvdoctor.extras import require

    if engine not in PROFILES:  # check_profile says so, after the other options are read
        return
    declared = profile_class(engine)
    if dry_run and declared.dry_run_extra is not None:
        require(declared.dry_run_extra, "--dry-run")
    if not static and declared.probe_extra is not None:
        extra, what = declared.probe_extra
        require(extra, f"--engine {engine} ({what})", hint=", or pass --static")


def dry_run_engines() -> list[str]:
    return [name for name in check_engines() if profile(name).dry_run() is not None]


def check_profile(engine: str) -> EngineProfile:
    """The profile `check --engine ENGINE` uses; InputError for a name that has none."""
    if not is_check_engine(engine):
        names = check_engines()
        raise InputError(f"unknown engine {engine!r}; expected one of: {', '.join(sorted(names))}")
    return profile(engine)
