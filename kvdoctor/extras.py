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


def extra_for_module(name: str | None) -> str | None:
    """The extra that provides a top-level module, for a ModuleNotFoundError nothing else caught."""
    top = (name or "").partition(".")[0]
    for extra in ("torch", "mlx", "sglang"):
        if top in EXTRAS[extra]:
            return extra
    return None
