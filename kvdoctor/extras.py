"""Optional dependencies: which pip extra a piece of work needs, and one line when it is missing.

The base install covers the static path (config and checkpoint headers) and every report. Probes
that build real caches and the dry run need an extra; the check is made before any work starts, by
looking the modules up (`find_spec`), never importing them.
"""
from __future__ import annotations

import importlib.util

from kvdoctor.errors import InputError

# extra -> the top-level modules it provides.
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "mlx": ("mlx", "mlx_lm"),
    "sglang": ("sglang", "mlx", "mlx_lm", "torch", "msgspec", "psutil"),
}
# engine -> (extra its probes need, what they build); the static path needs none.
PROBE_EXTRAS: dict[str, tuple[str, str]] = {
    "sglang-mlx": ("mlx", "its probes build MLX caches"),
    "sglang": ("torch", "its probes build torch state caches"),
}


class MissingExtra(InputError):
    """Work that needs an optional dependency which is not installed."""

    def __init__(self, extra: str, what: str, missing: list[str], hint: str = ""):
        super().__init__(f"{what} needs kvdoctor[{extra}] ({', '.join(missing)} not installed): "
                         f"pip install 'kvdoctor[{extra}]'{hint}")
        self.extra = extra


def missing_modules(extra: str) -> list[str]:
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(extra: str, what: str, hint: str = "") -> None:
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(extra, what, missing, hint)


def require_for_check(engine: str, static: bool, dry_run: bool) -> None:
    """Raise MissingExtra when `kvdoctor check` with these options needs a package that is absent."""
    if dry_run and engine == "sglang-mlx":  # the vLLM and SGLang-CUDA dry runs run in the engine's own Python
        require("sglang", "--dry-run")
    if not static and engine in PROBE_EXTRAS:
        extra, what = PROBE_EXTRAS[engine]
        require(extra, f"--engine {engine} ({what})", hint=", or pass --static")


def extra_for_module(name: str | None) -> str | None:
    """The extra that provides a top-level module, for a ModuleNotFoundError nothing else caught."""
    top = (name or "").partition(".")[0]
    for extra in ("torch", "mlx", "sglang"):
        if top in EXTRAS[extra]:
            return extra
    return None
