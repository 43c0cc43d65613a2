"""What an upgrade changes (`kvdoctor diff`): the same model and settings planned and sized at two releases
of one engine, compared. Refusals gained (UPG001) or lost (UPG002), the KV layout (UPG003: per-layer windows,
caches and specs, the budget's layer kinds, groups and pools, the defaults it resolved), and the capacity at
the budget (UPG004 when it falls, UPG005 when it rises).

Not among `RULE_MODULES`: `kvdoctor check` describes one release; `kvdoctor.pipeline.diff` runs this rule
with both sides in `ctx.observations[UPGRADE]`.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

import msgspec

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.engines.base import Plan
from kvdoctor.model import Finding

RULE = Rule(codes=("UPG001", "UPG002", "UPG003", "UPG004", "UPG005"), needs=("upgrade",))
UPGRADE = "upgrade"
# budget JSON keys that are not layout: the inputs, the outcome (compared on their own) and prose
NOT_LAYOUT = {"engine", "version", "mode", "capacity", "error", "notes", "provenance", "budget", "findings"}
MODE_INPUTS = {"release"}  # what the two sides differ in by construction
SHOWN = 6  # differences spelled out in a finding's message; the evidence holds all
# capacity figures where more is better (vLLM's tokens and concurrency, SGLang's pool tokens and running requests);
# the budget's other numbers are its inputs or the blocks a request holds, which UPG003's layout covers
MORE_IS_BETTER = ("tokens", "max_concurrency", "max_model_len_fit", "max_total_num_tokens", "max_running_requests",
                  "concurrency_at_L", "max_context_fit")


class Side(msgspec.Struct, frozen=True):
    """One release's answer for the model: its plan, and its budget row (None: no budget model, or the model
    cannot be priced)."""

    release: str
    plan: Plan[Any]
    budget: dict[str, Any] | None = None


class Upgrade(msgspec.Struct, frozen=True):
    engine: str
    before: Side
    after: Side


def run(ctx: Context) -> Iterable[Finding]:
    upgrade = ctx.observations.get(UPGRADE)
    if not isinstance(upgrade, Upgrade):
        return []
    a, b = upgrade.before, upgrade.after
    step = f"{upgrade.engine} {a.release} -> {b.release}"
    findings = list(_refusals(step, a, b))
    layout = _layer_changes(a.plan, b.plan) + _budget_layout_changes(a.budget, b.budget)
    if layout:
        findings.append(Finding("UPG003", f"{step}: the KV layout changes ({len(layout)}): " + _shown(layout),
                                evidence={"changes": layout}))
    findings.extend(_capacity(step, a.budget, b.budget))
    return findings


class Stop(msgspec.Struct, frozen=True):
    """One way a release stops: a refusal of its plan (by catalog code) or its sizing at the KV budget."""

    what: str  # the catalog code, or "at the KV budget"
    error_class: str
    message: str
    key: str | None = None
    source: str | None = None


def _stops(side: Side) -> dict[str, Stop]:
    out = {r.code: Stop(r.code, r.error_class, r.message, r.key, r.source) for r in side.plan.refusals}
    error = (side.budget or {}).get("error")
    if error and not out:  # a plan that stops before sizing says why itself
        out["budget"] = Stop("at the KV budget", error["class"], error["message"])
    return out


def _refusals(step: str, a: Side, b: Side) -> Iterable[Finding]:
    before, after = _stops(a), _stops(b)
    for name, stop in after.items():
        if name not in before:
            yield Finding("UPG001", f"{step}: {b.release} refuses this model at start-up ({stop.what}: "
                          f"{stop.error_class}: {stop.message.splitlines()[0] if stop.message else ''}); "
                          f"{a.release} {'starts it' if not before else 'refuses it otherwise'}",
                          key=stop.key, evidence={"refusal": stop.what, "message": stop.message,
                                                  "source": stop.source})
    for name, stop in before.items():
        if name not in after:
            yield Finding("UPG002", f"{step}: {a.release}'s refusal ({stop.what}: {stop.error_class}) is gone in "
                          f"{b.release}", key=stop.key, evidence={"refusal": stop.what, "message": stop.message})


def _layer_changes(a: Plan[Any], b: Plan[Any]) -> list[str]:
    """Each per-layer field that changes, once per (field, before, after) with the layers it applies to."""
    before = {p.index: p for p in a.layers}
    layers: dict[tuple[str, str, str], list[int]] = {}
    for layer in b.layers:
        old = before.get(layer.index)
        if old is None:
            continue
        fields = {"engine_window": (old.engine_window, layer.engine_window), "cache": (old.cache, layer.cache)}
        fields.update({k: (old.extra.get(k), layer.extra.get(k)) for k in {*old.extra, *layer.extra}})
        for name, (was, now) in sorted(fields.items()):
            if was != now:
                layers.setdefault((name, str(was), str(now)), []).append(layer.index)
    return [f"{name} {was} -> {now} ({_layers(ids)})" for (name, was, now), ids in layers.items()]


def _layers(ids: list[int]) -> str:
    return f"layer {ids[0]}" if len(ids) == 1 else f"{len(ids)} layers, {ids[0]}-{ids[-1]}"


def _budget_layout_changes(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    if a is None or b is None:
        return []
    out = [f"{key} {a['mode'].get(key)} -> {b['mode'].get(key)}" for key in sorted({*a["mode"], *b["mode"]})
           if key not in MODE_INPUTS and a["mode"].get(key) != b["mode"].get(key)]
    flat_a = _flat({k: v for k, v in a.items() if k not in NOT_LAYOUT})
    flat_b = _flat({k: v for k, v in b.items() if k not in NOT_LAYOUT})
    same: dict[tuple[str, str, str], int] = {}  # one line per field and change, however many entries share it
    for path in sorted({*flat_a, *flat_b}):
        was, now = flat_a.get(path, "absent"), flat_b.get(path, "absent")
        if was != now:
            field = re.sub(r"\[\d+\]", "[]", path)
            same[(field, str(was), str(now))] = same.get((field, str(was), str(now)), 0) + 1
    out += [f"{field} {was} -> {now}" + (f" (x{count})" if count > 1 else "") for (field, was, now), count in same.items()]
    return out


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    """A budget row's nested records as path -> value (`groups[0].block_size`)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{path}.{key}" if path else key).items()}
    if isinstance(value, list) and all(isinstance(item, (dict, list)) for item in value):
        found = {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{path}[{i}]").items()}
        return {**found, f"{path}.count": len(value)}
    return {path: value}


def _capacity(step: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> Iterable[Finding]:
    if a is None or b is None or a.get("error") or b.get("error"):
        return
    ca, cb = a["capacity"], b["capacity"]
    moved = {key: (ca[key], cb[key]) for key in MORE_IS_BETTER if key in ca and key in cb and ca[key] != cb[key]
             and isinstance(ca[key], (int, float)) and isinstance(cb[key], (int, float))}
    if not moved:
        return
    text = ", ".join(f"{key} {_num(was)} -> {_num(now)} ({(now - was) / was * 100:+.1f}%)" if was else
                     f"{key} {_num(was)} -> {_num(now)}" for key, (was, now) in moved.items())
    evidence = {"capacity": {key: {"before": was, "after": now} for key, (was, now) in moved.items()},
                "kv_budget_bytes": cb.get("kv_budget_bytes")}
    code = "UPG004" if any(now < was for was, now in moved.values()) else "UPG005"
    yield Finding(code, f"{step}: at the same KV budget, {text}", evidence=evidence)


def _shown(changes: list[str]) -> str:
    return "; ".join(changes[:SHOWN]) + (f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else "")


def _num(value: float) -> str:
    return f"{value:.2f}" if isinstance(value, float) else f"{value:,}"
