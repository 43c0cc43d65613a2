"""Pieces every engine calculator shares: a refusal the engine would raise, rounding helpers, the
result shape of one (engine, mode) budget, and the view a report shows of it."""
from __future__ import annotations

from typing import Any, Callable

import msgspec

from kvdoctor.limits import human_bytes

GiB = 1 << 30
MiB = 1 << 20
# The CUDA context alone on one GPU before anything loads: 0.13-0.14 GiB of non-torch memory at TP 1 in the
# calibration logs of vLLM 0.11 on H100 (tests/data/startup-logs); SGLang runs on the same CUDA runtime.
CUDA_CONTEXT = 133 * MiB


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def longest_fitting(fits: Callable[[int], bool], top: int) -> int:
    """The longest length in 1..top for which `fits` holds (it holds up to some length and not past it), 0 where
    not even one token fits: the binary search vLLM runs for `--max-model-len auto` and its admission hint."""
    if not fits(1):
        return 0
    lo, hi, best = 1, top, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


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


class Record(msgspec.Struct, kw_only=True):
    """A typed part of a budget row (its mode, capacity, state, a layer kind, a group or pool). Fields
    left UNSET are those the engine's plan did not reach (a refused mode has no capacity figures): the
    JSON leaves them out, where a None is written as null."""

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


class StateTensor(Record, kw_only=True):
    """One tensor of a request's recurrent state in one layer."""

    tensor: str  # conv | ssm | recurrent
    shape: list[int]
    dtype_bytes: int
    bytes: int


class Budget(msgspec.Struct, kw_only=True):
    """One engine in one mode. Each engine subclasses it with its own typed records (`mode`,
    `capacity`, `state`, `layer_kinds` and its layout); `capacity.unit` says what its token counts mean,
    because vLLM's 'tokens' (concurrency x context) and SGLang's pool tokens are different quantities."""

    engine: str
    version: str
    error: EngineRefusal | None = None
    notes: list[str] = msgspec.field(default_factory=list)  # what the engine logs about these choices
    provenance: dict[str, Any] = msgspec.field(default_factory=dict)

    def parts(self) -> tuple[Record, list[Any], Record | None, Record]:
        """(mode, layer kinds, state, capacity): the records every engine has."""
        raise NotImplementedError

    def layout_json(self) -> dict[str, Any]:
        """The engine's own layout between the layer kinds and the state (vLLM's groups and pool,
        SGLang's pools); empty where the engine has none or the mode was refused before it."""
        return {}

    def to_json(self) -> dict[str, Any]:
        mode, kinds, state, capacity = self.parts()
        out: dict[str, Any] = {"engine": self.engine, "version": self.version, "mode": mode.to_json(),
                               "layer_kinds": [k.to_json() for k in kinds], **self.layout_json(),
                               "state": state.to_json() if state is not None else None,
                               "capacity": capacity.to_json()}
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
