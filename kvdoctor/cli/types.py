"""Command-line value types of strict.py, for `typer.Option(click_type=...)`, built on first use.

strict.py validates with pydantic; importing it for every command would put pydantic on the static
path, which without a deploy file, config file or baseline needs none.
"""
from __future__ import annotations

from typing import Any, Callable

from kvdoctor.limits import PLAIN_INT_RANGES


def strict_type(type_name: str, kind: type = str, metavar: str | None = None):
    """strict.command_line_type(strict.TYPE_NAME, ...), built when a value is first given: strict.py
    imports pydantic (about 0.3 s), which a static check without deploy file, config file or baseline
    never needs. What strict's type would accept unchanged goes through without it: a printable,
    non-blank name (strict.Name), and a plain decimal integer within its range (`-j 2`)."""
    from typer._click.types import ParamType  # typer 0.28 carries its own copy of click

    class LazyValue(ParamType):
        name = metavar or {int: "INTEGER", float: "NUMBER"}.get(kind, "TEXT")
        real: Any = None

        def convert(self, value: Any, param, ctx) -> Any:
            if not isinstance(value, str):
                return value  # a default
            if type_name == "Name" and value.strip() and value.isprintable():
                return value
            if type_name in PLAIN_INT_RANGES and value.isascii() and value.isdigit() and value[0] != "0":
                low, high = PLAIN_INT_RANGES[type_name]
                if low <= int(value) <= high:
                    return int(value)
            if self.real is None:
                from kvdoctor.load import strict

                self.real = strict.command_line_type(getattr(strict, type_name), kind, metavar)
            return self.real.convert(value, param, ctx)

    return LazyValue()


def engine_type(names: Callable[[], list[str]]):
    """An `--engine` value, taken as given (the command checks it and lists the names in its error). Its
    metavar, `[hf|vllm|...]`, comes from `names()`, the engines registry, and is asked for only by
    --help: listing the profiles imports them (about 1 s), which a check of one engine never needs."""
    from typer._click.types import ParamType

    class EngineName(ParamType):
        name = "ENGINE"

        def convert(self, value: Any, param, ctx) -> Any:
            return value

        def get_metavar(self, param, ctx) -> str:
            return "[" + "|".join(names()) + "]"

    return EngineName()
