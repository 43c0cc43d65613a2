"""Real torch tensors for one KDA layer: the recipe's per-slot caches and the decode step's inputs.

Slot counts stay small (the per-slot shapes are the true ones), so a build costs a few MiB.
"""
from __future__ import annotations

from typing import Any, Optional

import msgspec
from msgspec.structs import fields

from kvdoctor.engines.sglang.kda.dims import Geometry
from kvdoctor.engines.sglang.kda.recipe import Recipe, per_slot_shape, resolve_dtype
from kvdoctor.limits import DTYPE_BYTES

POOL_SIZE = 3  # request slots in a build: the pool holds POOL_SIZE + 1 with sglang's padding slot 0
BATCH_SLOTS = (1, POOL_SIZE, -1)  # decode rows: two occupied slots (the first and the last) and a padded row
CACHE_NAMES = ("initial_state", "conv_state", "d_cache", "k_cache", "g_cache")


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}[name]


class Caches(msgspec.Struct):
    initial_state: Any
    conv_state: Optional[Any]
    d_cache: Any
    k_cache: Any
    g_cache: Any
    write_pos: Any
    force_flush: Optional[Any]

    def clone(self) -> "Caches":
        return Caches(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).clone()
                         for f in fields(self)})


class DecodeInputs(msgspec.Struct):
    """What the backend hands the wrapper for one decode step, shaped as sglang's call site shapes it."""

    mixed_qkv: Any
    a: Any
    b: Any
    A_log: Any
    dt_bias: Any
    out: Any
    ssm_state_indices: Any
    scale: float


def cache_shapes(recipe: Recipe, geom: Geometry, batch: int, size: int = POOL_SIZE) -> dict[str, tuple[int, ...]]:
    """Full shapes (slot dim first for pool tensors, batch-shaped for the cursors) the recipe gives."""
    symbols = geom.symbols(batch)
    shapes: dict[str, tuple[int, ...]] = {}
    for name in CACHE_NAMES:
        spec = getattr(recipe.tensors, name)
        if spec is not None:
            shapes[name] = (recipe.slot_count(name, size), *per_slot_shape(spec, symbols))
    shapes["write_pos"] = per_slot_shape(recipe.write_pos, symbols)
    if recipe.force_flush is not None:
        shapes["force_flush"] = per_slot_shape(recipe.force_flush, symbols)
    return shapes


def negative_shape(shapes: dict[str, tuple[int, ...]]) -> Optional[str]:
    """The first tensor a recipe gives a negative size, as "name (shape)", or None."""
    for name, shape in shapes.items():
        if any(d < 0 for d in shape):
            return f"{name} {list(shape)}"
    return None


def build_bytes(recipe: Recipe, geom: Geometry, ssm_dtype: str, batch: int = len(BATCH_SLOTS),
                size: int = POOL_SIZE) -> int:
    """Bytes `build_caches` would allocate, so the budget can be checked before anything is built."""
    dtypes = cache_dtypes(recipe, ssm_dtype)
    total = 0
    for name, shape in cache_shapes(recipe, geom, batch, size).items():
        numel = 1
        for d in shape:
            numel *= max(d, 0)
        total += numel * DTYPE_BYTES[dtypes[name]]
    return total


def input_bytes(geom: Geometry, batch: int = len(BATCH_SLOTS)) -> int:
    """Bytes of one decode step's inputs (at most 4 bytes an element)."""
    per_row = geom.q_width + geom.k_width + geom.v_width + geom.a_width + geom.b_width + geom.HV * geom.V
    return 4 * (batch * per_row + geom.A_log_numel + geom.dt_bias_numel + batch)


def cache_dtypes(recipe: Recipe, ssm_dtype: str) -> dict[str, str]:
    out = {name: resolve_dtype(getattr(recipe.tensors, name).dtype, ssm_dtype)
           for name in CACHE_NAMES if getattr(recipe.tensors, name) is not None}
    out["write_pos"] = resolve_dtype(recipe.write_pos.dtype, ssm_dtype)
    if recipe.force_flush is not None:
        out["force_flush"] = resolve_dtype(recipe.force_flush.dtype, ssm_dtype)
    return out


def per_slot_report(recipe: Recipe, geom: Geometry, ssm_dtype: str) -> dict[str, Any]:
    """Per-slot shapes (slot dim left out) and bytes of one layer's state, for the JSON report."""
    symbols = geom.symbols(batch=1)
    dtypes = cache_dtypes(recipe, ssm_dtype)
    entry: dict[str, Any] = {}
    total = 0
    for name in CACHE_NAMES:
        spec = getattr(recipe.tensors, name)
        if spec is None:
            continue
        shape = per_slot_shape(spec, symbols)
        numel = 1
        for d in shape:
            numel *= d
        entry[name] = list(shape)
        total += numel * DTYPE_BYTES[dtypes[name]]
    entry["bytes_per_slot"] = total
    return entry


def build_caches(recipe: Recipe, geom: Geometry, *, ssm_dtype: str, batch: int = len(BATCH_SLOTS),
                 size: int = POOL_SIZE, device: str = "cpu") -> Caches:
    """Allocate the recipe's tensors (zeros, like the pool) on `device`."""
    import torch

    shapes = cache_shapes(recipe, geom, batch, size)
    dtypes = cache_dtypes(recipe, ssm_dtype)
    made = {name: torch.zeros(shapes[name], dtype=torch_dtype(dtypes[name]), device=device) for name in shapes}
    return Caches(initial_state=made["initial_state"], conv_state=made.get("conv_state"), d_cache=made["d_cache"],
                  k_cache=made["k_cache"], g_cache=made["g_cache"], write_pos=made["write_pos"],
                  force_flush=made.get("force_flush"))


def build_inputs(geom: Geometry, *, act_dtype: str = "bfloat16", slots: tuple[int, ...] = BATCH_SLOTS,
                 device: str = "cpu") -> DecodeInputs:
    """Zeroed decode inputs with the widths the layer's weights produce (per rank)."""
    import torch

    dt = torch_dtype(act_dtype)
    B = len(slots)
    a = torch.zeros(B, geom.a_width, dtype=dt, device=device)
    if geom.HV and geom.a_width % geom.HV == 0:
        a = a.reshape(B, geom.HV, -1).contiguous()
    dt_bias = torch.zeros(geom.dt_bias_numel, dtype=torch.float32, device=device)
    if geom.HV and geom.dt_bias_numel % geom.HV == 0:
        dt_bias = dt_bias.reshape(geom.HV, -1).contiguous()
    return DecodeInputs(
        mixed_qkv=torch.zeros(B, geom.q_width + geom.k_width + geom.v_width, dtype=dt, device=device),
        a=a,
        b=torch.zeros(B, geom.b_width, dtype=dt, device=device),
        A_log=torch.zeros(geom.A_log_numel, dtype=torch.float32, device=device),
        dt_bias=dt_bias,
        out=torch.zeros(B, 1, geom.HV, geom.V, dtype=dt, device=device),
        ssm_state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
        scale=geom.K ** -0.5 if geom.K > 0 else 1.0,
    )
