"""The latent-bug probe: rebuild a recipe with every dimension distinct and see what breaks.

Kimi-Linear-48B has K = V = 128 and H = HV = 32, so a ring sized with the value dim where the key dim
belongs (or with the key heads where the value heads belong) has exactly the right shape there and
passes every check. With H=2, HV=4, K=32, V=64, L=3 no two symbols coincide, so such a recipe fails
the wrapper's checks, and the probe can name the symbol each wrong dimension was sized with.
"""
from __future__ import annotations

from typing import Optional

import msgspec

from kvdoctor.engines.sglang.kda.caches import BATCH_SLOTS, build_caches, build_inputs, cache_shapes, negative_shape
from kvdoctor.engines.sglang.kda.dims import PROBE, Geometry
from kvdoctor.engines.sglang.kda.recipe import Recipe
from kvdoctor.engines.sglang.kda.validate import WRAPPERS, Failure, invariants

EXPECTED = {"initial_state": ("HV", "V", "K"), "d_cache": ("HV", "L", "V"), "k_cache": ("H", "L", "K"),
            "g_cache": ("HV", "L", "K")}


class WrongDim(msgspec.Struct):
    tensor: str
    dim: int  # index in the full tensor (slot dim = 0)
    expected: str
    sized_with: list[str]  # probe symbols equal to what the recipe gave
    got: int


class Latent(msgspec.Struct):
    failure: Failure
    wrong: list[WrongDim] = msgspec.field(default_factory=list)
    hidden_by: list[str] = msgspec.field(default_factory=list)  # e.g. "K = V = 128"


def probe_geometry(real: Geometry) -> Geometry:
    return Geometry.consistent(W=real.W, **PROBE)


def probe(recipe: Recipe, validator: str, real: Geometry) -> Optional[Latent]:
    """A Latent when the recipe fails on distinct dims; `real` (a geometry that passed) explains why the
    model's own shapes hid it."""
    geom = probe_geometry(real)
    negative = negative_shape(cache_shapes(recipe, geom, batch=len(BATCH_SLOTS)))
    if negative:
        return Latent(failure=Failure("replayssm-latent-ring-sizing", f"the recipe gives {negative}", "silent"))
    caches = build_caches(recipe, geom, ssm_dtype="float32")
    inputs = build_inputs(geom, act_dtype="float32")
    failure = WRAPPERS[validator](inputs, caches) or next(iter(invariants(inputs, caches)), None)
    if failure is None:
        return None
    latent = Latent(failure=failure)
    values = geom.symbols(batch=1)
    values.pop("B")
    real_values = real.symbols(batch=1)
    for tensor, expected in EXPECTED.items():
        got = tuple(getattr(caches, tensor).shape[1:])
        for i, (g, want) in enumerate(zip(got, expected)):
            if g == values[want]:
                continue
            names = [s for s, v in values.items() if v == g]
            latent.wrong.append(WrongDim(tensor, i + 1, want, names, int(g)))
            for name in names:
                if real_values[name] == real_values[want]:
                    latent.hidden_by.append(f"{want} = {name} = {real_values[want]}")
        if len(got) != len(expected):
            latent.wrong.append(WrongDim(tensor, len(got), "/".join(expected), [], -1))
    latent.hidden_by = sorted(set(latent.hidden_by))
    return latent


def describe(latent: Latent) -> str:
    parts = []
    for w in latent.wrong:
        if w.sized_with:
            parts.append(f"{w.tensor} dim {w.dim} is sized with {' or '.join(w.sized_with)} where the kernel "
                         f"expects {w.expected}")
        elif w.got >= 0:
            parts.append(f"{w.tensor} dim {w.dim} is {w.got} where the kernel expects {w.expected}")
        else:
            parts.append(f"{w.tensor} does not have the kernel's [slots, {', '.join(w.expected.split('/'))}] rank")
    return "; ".join(parts) if parts else "the recipe fails only when the dimensions differ"
