"""The engine's own ReplaySSM kernels on a CUDA GPU, driven with kvdoctor's caches and compared with
the reference recurrence (kvdoctor.engines.sglang.kda.replay).

Needs CUDA plus `sglang==0.5.23` (installed with --no-deps), `helion==1.4.0` and triton (see
bench/gpu_kda.py for the install lines). The kernel
modules are loaded by file, without running `sglang/__init__` (which pulls in the whole server).
Everything here skips with a one-line reason when a piece is missing.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Callable, Optional

import msgspec

from kvdoctor.engines.sglang.kda.caches import build_caches
from kvdoctor.engines.sglang.kda.dims import Geometry
from kvdoctor.engines.sglang.kda.recipe import DEFAULT_RECIPE, Recipe, load_recipe
from kvdoctor.engines.sglang.kda.replay import fill_random, naive_step, random_step, reconstruct, relative_error

HELION_MODULE = "sglang.kernels.ops.attention.helion.kda_replayssm"
HELION_FUNCTION = "helion_fused_recurrent_kda_replayssm_decode"
TRITON_MODULE = "sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm"
TRITON_FUNCTION = "fused_recurrent_linear_replayssm_decode"
# Relative tolerances: the kernels rebuild the state with a tensor-core dot in the activation dtype
# (TF32 for fp32), so they sit near 1e-3 (fp32) and 7e-3 (bf16) from the fp32 recurrence.
TOLERANCE = {"float32": 2e-3, "bfloat16": 1.5e-2, "float16": 1.5e-2}


def unavailable_reason(interpret: bool = False) -> Optional[str]:
    """Why the GPU run cannot happen here, or None when it can. `interpret`: the Triton twin on CPU under
    TRITON_INTERPRET=1 needs only sglang and triton."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not interpret and not torch.cuda.is_available():
        return "no CUDA device"
    wanted = ("sglang", "triton") if interpret else ("sglang", "helion", "triton")
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    if missing:
        return f"missing package(s): {', '.join(missing)} (see bench/gpu_kda.py for the install lines)"
    return None


def _package(name: str, directory: Path, run_init: bool = False) -> None:
    """Register a package by path; its __init__ runs only when asked (sglang's own ones are heavy)."""
    if name in sys.modules:
        return
    if run_init:
        spec = importlib.util.spec_from_file_location(name, directory / "__init__.py",
                                                      submodule_search_locations=[str(directory)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = types.ModuleType(name)
        module.__path__ = [str(directory)]
        module.__package__ = name
        sys.modules[name] = module


def load_kernels(backends: tuple[str, ...] = ("helion", "triton")) -> dict[str, Callable[..., Any]]:
    """{"helion": wrapper, "triton": twin} from the installed sglang, loaded file by file."""
    root_spec = importlib.util.find_spec("sglang")  # a top-level find_spec does not import the package
    root = Path(next(iter(root_spec.submodule_search_locations)))
    attention = root / "kernels" / "ops" / "attention"
    for name, directory in (("sglang", root), ("sglang.kernels", root / "kernels"),
                            ("sglang.kernels.ops", root / "kernels" / "ops"),
                            ("sglang.kernels.ops.attention", attention),
                            ("sglang.kernels.ops.attention.linear", attention / "linear")):
        _package(name, directory)
    _package("sglang.kernels.ops.attention.helion", attention / "helion", run_init=True)  # one constant
    where = {"helion": (HELION_MODULE, HELION_FUNCTION), "triton": (TRITON_MODULE, TRITON_FUNCTION)}
    return {b: getattr(importlib.import_module(where[b][0]), where[b][1]) for b in backends}


class GpuCase(msgspec.Struct):
    backend: str
    geometry: Geometry
    act_dtype: str = "bfloat16"
    state_dtype: str = "float32"
    lower_bound: Optional[float] = None
    steps: Optional[int] = None
    output_error: float = float("nan")
    state_error: float = float("nan")
    padded_rows_zero: bool = False
    untouched_slots_intact: bool = False
    raised: Optional[str] = None
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def tolerance(self) -> float:
        return max(TOLERANCE[self.act_dtype], TOLERANCE[self.state_dtype])

    @property
    def ok(self) -> bool:
        return (self.raised is None and self.output_error <= self.tolerance and self.state_error <= self.tolerance
                and self.padded_rows_zero and self.untouched_slots_intact)

    def label(self) -> str:
        g = self.geometry
        lb = f", lower_bound {self.lower_bound}" if self.lower_bound is not None else ""
        return f"H={g.H} HV={g.HV} K={g.K} V={g.V} L={g.L}; act {self.act_dtype} / state {self.state_dtype}{lb}"


def run_case(case: GpuCase, kernel: Callable[..., Any], recipe: Optional[Recipe] = None, seed: int = 0,
             device: str = "cuda") -> GpuCase:
    """Drive the engine's kernel on device caches from the recipe, side by side with the fp32 recurrence on
    CPU from identical inputs: 2L + 3 steps, two occupied slots, a padded row, one forced flush.
    (`device="cpu"` runs the Triton twin under TRITON_INTERPRET=1.)"""
    import torch

    from kvdoctor.engines.sglang.kda.caches import torch_dtype

    recipe = recipe or load_recipe(DEFAULT_RECIPE)
    geom = case.geometry
    gen = torch.Generator().manual_seed(seed)
    host = build_caches(recipe, geom, ssm_dtype=case.state_dtype)
    fill_random(host, gen)
    dev = host.clone()
    for name in ("initial_state", "d_cache", "k_cache", "g_cache"):
        setattr(dev, name, getattr(host, name).clone().to(device))
    dense = host.initial_state.float().clone()
    L = int(host.d_cache.shape[2])
    size = int(host.initial_state.shape[0]) - 1
    slots = [1, size, -1]
    cursor = [0] * (size + 1)
    A_log = torch.randn(geom.HV, generator=gen) * 0.5
    dt_bias = torch.randn(geom.HV, geom.K, generator=gen)
    n = case.steps or 2 * L + 3
    case.steps = n
    forced_at = max(1, L - 2)
    errors = []
    case.padded_rows_zero = True
    try:
        for step in range(n):
            x = random_step(geom, slots, gen, act_dtype=case.act_dtype)
            x.A_log, x.dt_bias, x.lower_bound = A_log, dt_bias, case.lower_bound
            if step == forced_at:
                x.force_flush[0] = 1
            write_pos = [cursor[max(s, 0)] for s in slots]
            out = torch.empty(len(slots), 1, geom.HV, geom.V, dtype=torch_dtype(case.act_dtype), device=device)
            kwargs = dict(mixed_qkv=x.mixed_qkv.to(device), a=x.a.to(device).contiguous(),
                          b=x.b.to(device).contiguous(), A_log=A_log.to(device), dt_bias=dt_bias.to(device).contiguous(),
                          scale=x.scale, initial_state=dev.initial_state, d_cache=dev.d_cache, k_cache=dev.k_cache,
                          g_cache=dev.g_cache, out=out, ssm_state_indices=x.slots.to(device),
                          write_pos=torch.tensor(write_pos, dtype=torch.int32, device=device),
                          force_flush=x.force_flush.to(device), use_qk_l2norm_in_kernel=True)
            if case.backend == "triton":
                kwargs["is_kda"] = True
            else:
                kwargs["lower_bound"] = case.lower_bound
            kernel(**kwargs)
            if device != "cpu":
                torch.cuda.synchronize()
            want = naive_step(dense, x, geom)
            got = out[:, 0].float().cpu()
            errors.append(relative_error(got[:2], want[:2]))
            if bool(got[2].abs().max() != 0):
                case.padded_rows_zero = False
            for row, slot in enumerate(slots):
                if slot >= 0:
                    flushed = write_pos[row] == L - 1 or int(x.force_flush[row]) != 0
                    cursor[slot] = recipe.next_cursor(write_pos[row], L, flushed)
    except (ValueError, RuntimeError) as exc:
        case.raised = f"{type(exc).__name__}: {exc}"
        return case
    case.output_error = max(errors)
    final = dev.clone()
    for name in ("initial_state", "d_cache", "k_cache", "g_cache"):
        setattr(final, name, getattr(dev, name).cpu())
    group = geom.HV // geom.H
    case.state_error = max(relative_error(reconstruct(final, s, cursor[s], group), dense[s]) for s in (1, size))
    case.untouched_slots_intact = all(
        torch.equal(getattr(final, name)[s], getattr(host, name)[s])
        for name in ("initial_state", "d_cache", "k_cache", "g_cache") for s in range(size + 1) if s not in (1, size))
    return case


# Mis-sized recipes whose error the real wrapper must raise exactly as kvdoctor's emulation predicts.
CONTRACT_VARIANTS = {
    "healthy (sglang 0.5.23 rule)": None,
    "g_cache sized with V": ("g_cache", ["HV", "L", "V"], "float32"),
    "g_cache grouped by H": ("g_cache", ["H", "L", "K"], "float32"),
    "g_cache in bf16": ("g_cache", ["HV", "L", "K"], "bfloat16"),
    "d_cache sized with K": ("d_cache", ["HV", "L", "K"], "ssm"),
    "k_cache grouped by HV": ("k_cache", ["HV", "L", "K"], "ssm"),
}


def variant(recipe: Recipe, change: Optional[tuple[str, list, str]]) -> Recipe:
    from kvdoctor.engines.sglang.kda.recipe import TensorRecipe

    if change is None:
        return recipe
    tensor, shape, dtype = change
    tensors = recipe.tensors.model_copy(update={tensor: TensorRecipe(shape=shape, dtype=dtype)})
    return recipe.model_copy(update={"tensors": tensors})


def contract_check(kernel: Callable[..., Any], backend: str, recipe: Recipe, geom: Geometry,
                   act_dtype: str = "bfloat16", device: str = "cuda") -> tuple[Optional[str], Optional[str]]:
    """(message kvdoctor predicts, message the engine's wrapper raised); None where nothing is raised."""
    from kvdoctor.engines.sglang.kda.caches import build_inputs
    from kvdoctor.engines.sglang.kda.validate import WRAPPERS

    caches = build_caches(recipe, geom, ssm_dtype="float32", device=device)
    x = build_inputs(geom, act_dtype=act_dtype, device=device)
    predicted = WRAPPERS[backend](x, caches)
    kwargs = dict(mixed_qkv=x.mixed_qkv, a=x.a, b=x.b, A_log=x.A_log, dt_bias=x.dt_bias, scale=x.scale,
                  initial_state=caches.initial_state, d_cache=caches.d_cache, k_cache=caches.k_cache,
                  g_cache=caches.g_cache, out=x.out, ssm_state_indices=x.ssm_state_indices,
                  write_pos=caches.write_pos, force_flush=caches.force_flush, use_qk_l2norm_in_kernel=True)
    if backend == "triton":
        kwargs["is_kda"] = True
    raised = None
    try:
        kernel(**kwargs)
    except ValueError as exc:
        raised = str(exc)
    return (predicted.message if predicted else None), raised
