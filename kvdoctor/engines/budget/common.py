"""Pieces every engine calculator shares: a refusal the engine would raise, rounding helpers, the
result shape of one (engine, mode) budget, and the view a report shows of it."""
from __future__ import annotations

from typing import Any

import msgspec

from kvdoctor.limits import human_bytes

GiB = 1 << 30
MiB = 1 << 20


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class EngineRefusal(Exception):
    """What the engine raises for these settings: its exception class and its exact message."""

    def __init__(self, cls: str, message: str, stage: str = "startup") -> None:
        super().__init__(cls, message, stage)
        self.cls, self.message, self.stage = cls, message, stage

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EngineRefusal) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]  # equal by value, like the records beside it

    def to_json(self) -> dict[str, str]:
        return {"class": self.cls, "message": self.message, "stage": self.stage}


class Budget(msgspec.Struct):
    """One engine in one mode. `capacity.unit` says what its token counts mean, because vLLM's
    'tokens' (concurrency x context) and SGLang's pool tokens are different quantities."""

    engine: str
    version: str
    mode: dict[str, Any]
    layer_kinds: list[dict[str, Any]] = msgspec.field(default_factory=list)
    groups: list[dict[str, Any]] | None = None
    pools: list[dict[str, Any]] | None = None
    pool: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    capacity: dict[str, Any] = msgspec.field(default_factory=dict)
    error: EngineRefusal | None = None
    notes: list[str] = msgspec.field(default_factory=list)  # what the engine logs about these choices
    facts: dict[str, Any] = msgspec.field(default_factory=dict)  # numbers rules read (not printed)
    provenance: dict[str, Any] = msgspec.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine, "version": self.version, "mode": self.mode,
                               "layer_kinds": self.layer_kinds}
        if self.groups is not None:
            out["groups"] = self.groups
        if self.pools is not None:
            out["pools"] = self.pools
        if self.pool is not None:
            out["pool"] = self.pool
        out["state"] = self.state
        out["capacity"] = self.capacity
        if self.error is not None:
            out["error"] = self.error.to_json()
        out["notes"] = self.notes
        out["provenance"] = self.provenance
        return out


class BudgetView(msgspec.Struct, frozen=True):
    """One row of a budget document (`Budget.to_json`) in its engine's own terms, for the reports: the
    engine's profile makes it (`EngineProfile.budget_view`), so no report reads an engine's fields."""

    mode: tuple[str, ...]  # every knob of the mode, one a line ("kv fp8", "tp 4", ...)
    label: tuple[str, ...]  # the knobs a finding names the mode by
    layout: str  # groups, pools or caches, one a line; "-" when there are none
    state: str  # the recurrent state, one item a line
    capacity: str  # what fits, one figure a line (a refused row shows its error instead)
    tokens: int | None  # tokens of KV that fit within the budget; None when the engine refuses
    colour: str  # the engine's colour in the terminal's bar chart


def n(value: Any) -> str:
    """An integer with thousands separators; anything else as it prints."""
    return f"{value:,}" if isinstance(value, int) else str(value)


def size(value: int | None) -> str:
    """Bytes in the largest binary unit up to GiB, two decimals; "-" for none."""
    return "-" if value is None else human_bytes(value, 2, largest="GiB")
