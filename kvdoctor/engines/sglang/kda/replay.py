"""Reference KDA decode kernels in plain torch, and the side-by-side run that checks a recipe's rings.

Two implementations of one decode step:
- `naive_step`: the gated delta recurrence on a dense state S (V x K per value head):
  S' = S * exp(g) (per key channel), d = beta (v - S' k), S_new = S' + d k^T, o = S_new q * scale.
- `replay_step`: the ReplaySSM protocol on the recipe's caches: rebuild S from the checkpoint and the
  first m ring rows, emit o, then either append (d, k, g) at row m or, on a flush (m == L - 1 or a
  forced one), write S_new into the checkpoint and leave the ring alone.
The caller's cursor rule (the recipe's `cursor`) moves m between steps, as sglang's backend does.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import msgspec

from kvdoctor.engines.sglang.kda.caches import Caches, build_caches, torch_dtype
from kvdoctor.engines.sglang.kda.dims import Geometry
from kvdoctor.engines.sglang.kda.recipe import Recipe
from kvdoctor.engines.sglang.kda.validate import Failure, cursor_range

L2_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
FP32_TOLERANCE = 1e-5  # relative; measured errors sit near 1e-7 (docs/kda.md)
LOW_PRECISION_TOLERANCE = 2e-2  # when the recipe stores state or rings in 16-bit floats


class StepInputs(msgspec.Struct):
    mixed_qkv: Any  # [B, 2 H K + HV V]
    a: Any  # [B, HV, K]
    b: Any  # [B, HV]
    A_log: Any  # [HV]
    dt_bias: Any  # [HV, K]
    slots: Any  # [B] int32, < 0 for a padded row
    force_flush: Any  # [B] int32
    scale: float
    lower_bound: Optional[float] = None


def unpack(x: StepInputs, geom: Geometry):
    """q, k: [B, HV, K] (each key head repeated for its value-head group), v: [B, HV, V], in fp32."""
    H, HV, K, V = geom.H, geom.HV, geom.K, geom.V
    qkv = x.mixed_qkv.float()
    B = qkv.shape[0]
    q = qkv[:, : H * K].reshape(B, H, K)
    k = qkv[:, H * K: 2 * H * K].reshape(B, H, K)
    v = qkv[:, 2 * H * K:].reshape(B, HV, V)
    group = HV // H
    return q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1), v


def l2norm(t):
    return t / (t * t).sum(-1, keepdim=True).add(L2_EPS).sqrt()


def log_decay(x: StepInputs):
    """Per-channel natural-log decay g <= 0, [B, HV, K]."""
    import torch

    pre = x.a.float() + x.dt_bias.float().reshape(1, *x.a.shape[1:])
    rate = x.A_log.float().exp().reshape(1, -1, 1)
    if x.lower_bound is not None:
        return x.lower_bound * torch.sigmoid(rate * pre)
    softplus = torch.where(pre > SOFTPLUS_THRESHOLD, pre, torch.log1p(pre.clamp(max=SOFTPLUS_THRESHOLD).exp()))
    return -rate * softplus


def beta_of(x: StepInputs):
    import torch

    # The ReplaySSM kernels round beta through b's dtype before accumulating in fp32.
    return torch.sigmoid(x.b.float()).to(x.b.dtype).float()


def _token(x: StepInputs, geom: Geometry):
    q, k, v = unpack(x, geom)
    return l2norm(q) * x.scale, l2norm(k), v, log_decay(x), beta_of(x)


def _matvec(S, x):
    """Per head: S [HV, V, K] times x [HV, K] -> [HV, V]."""
    import torch

    return torch.bmm(S, x.unsqueeze(-1)).squeeze(-1)


def naive_step(states, x: StepInputs, geom: Geometry):
    """One token of the recurrence on dense fp32 states [slots, HV, V, K] (updated in place). Returns o."""
    import torch

    q, k, v, g, beta = _token(x, geom)
    out = torch.zeros(v.shape[0], geom.HV, geom.V)
    for row, slot in enumerate(int(s) for s in x.slots.tolist()):
        if slot < 0:
            continue
        S = states[slot] * g[row].exp()[:, None, :]
        d = beta[row][:, None] * (v[row] - _matvec(S, k[row]))
        S = S + d[:, :, None] * k[row][:, None, :]
        states[slot] = S
        out[row] = _matvec(S, q[row])
    return out


def reconstruct(c: Caches, slot: int, m: int, group: int):
    """The state before the next token: checkpoint decayed by every ring gate, plus each ring row's
    delta times its key decayed by the gates that came after it. [HV, V, K] fp32."""
    import torch

    S0 = c.initial_state[slot].float()
    if m == 0:
        return S0.clone()
    g = c.g_cache[slot, :, :m].float()  # [HV, m, K]
    d = c.d_cache[slot, :, :m].float()  # [HV, m, V]
    k = c.k_cache[slot, :, :m].float().repeat_interleave(group, dim=0)  # [HV, m, K]
    total = g.sum(1)  # [HV, K]
    after = total[:, None, :] - g.cumsum(1)  # gates applied after row j
    return S0 * total.exp()[:, None, :] + torch.bmm(d.transpose(1, 2), k * after.exp())


def replay_step(c: Caches, x: StepInputs, write_pos: list[int], geom: Geometry):
    """One token of ReplaySSM on the caches (updated in place, as the kernel does). Returns o."""
    import torch

    q, k, v, g, beta = _token(x, geom)
    L = int(c.d_cache.shape[2])
    group = geom.HV // geom.H
    out = torch.zeros(v.shape[0], geom.HV, geom.V)
    for row, slot in enumerate(int(s) for s in x.slots.tolist()):
        if slot < 0:
            continue
        m = int(write_pos[row])
        S = reconstruct(c, slot, m, group) * g[row].exp()[:, None, :]
        d = beta[row][:, None] * (v[row] - _matvec(S, k[row]))
        out[row] = _matvec(S, q[row]) + d * (k[row] * q[row]).sum(-1, keepdim=True)
        if m == L - 1 or int(x.force_flush[row]) != 0:
            S_new = S + d[:, :, None] * k[row][:, None, :]
            c.initial_state[slot] = S_new.to(c.initial_state.dtype)
        else:
            c.d_cache[slot, :, m] = d.to(c.d_cache.dtype)
            c.g_cache[slot, :, m] = g[row].to(c.g_cache.dtype)
            c.k_cache[slot, :, m] = k[row][::group].to(c.k_cache.dtype)  # the first value head of each group
    return out


def relative_error(got, want) -> float:
    scale = float(want.abs().max())
    return float((got.float() - want.float()).abs().max()) / (scale if scale > 0 else 1.0)


class KernelRun(msgspec.Struct):
    """What a side-by-side run observed."""

    geometry: dict[str, int]
    steps: int
    output_error: float = 0.0
    state_error: float = 0.0
    tolerance: float = FP32_TOLERANCE
    padded_rows_zero: bool = True
    untouched_slots_intact: bool = True
    flushes: int = 0
    forced_flushes: int = 0
    failure: Optional[Failure] = None
    problems: list[str] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"geometry": self.geometry, "steps": self.steps, "output_rel_error": self.output_error,
                "state_rel_error": self.state_error, "tolerance": self.tolerance, "flushes": self.flushes,
                "forced_flushes": self.forced_flushes, "padded_rows_zero": self.padded_rows_zero,
                "untouched_slots_intact": self.untouched_slots_intact, "ok": self.ok}


def random_step(geom: Geometry, slots: list[int], gen, act_dtype: str = "float32") -> StepInputs:
    """Random decode inputs for one step; A_log and dt_bias are drawn once per run by the caller."""
    import torch

    B = len(slots)
    dt = torch_dtype(act_dtype)
    return StepInputs(
        mixed_qkv=torch.randn(B, 2 * geom.H * geom.K + geom.HV * geom.V, generator=gen).to(dt),
        a=torch.randn(B, geom.HV, geom.K, generator=gen).to(dt),
        b=torch.randn(B, geom.HV, generator=gen).to(dt),
        A_log=None, dt_bias=None,
        slots=torch.tensor(slots, dtype=torch.int32),
        force_flush=torch.zeros(B, dtype=torch.int32),
        scale=geom.K ** -0.5,
    )


def fill_random(c: Caches, gen) -> None:
    """Random checkpoints everywhere and garbage in every ring row: rows at or past the cursor must be
    ignored, and slots no row uses must come out bit-identical."""
    import torch

    for t in (c.initial_state, c.d_cache, c.k_cache):
        t.copy_((0.5 * torch.randn(t.shape, generator=gen)).to(t.dtype))
    c.g_cache.copy_((-torch.rand(c.g_cache.shape, generator=gen)).to(c.g_cache.dtype))


def kernel_run(recipe: Recipe, geom: Geometry, *, ssm_dtype: str = "float32", steps: Optional[int] = None,
               seed: int = 0, lower_bound: Optional[float] = None) -> KernelRun:
    """Drive the replay on the recipe's caches and the naive recurrence side by side.

    Rows: the pool's first and last request slots plus a padded row; at least 2L + 3 steps; one forced
    flush at a cursor that would not flush by itself. Compares every output, then each occupied slot's
    state rebuilt from checkpoint + ring with the dense one; checks padded rows and unused slots.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    caches = build_caches(recipe, geom, ssm_dtype=ssm_dtype)
    L = int(caches.d_cache.shape[2])
    size = int(caches.initial_state.shape[0]) - 1
    slots = [1, size, -1]
    n = steps or 2 * L + 3
    low = any(t.dtype != torch.float32 for t in (caches.initial_state, caches.d_cache, caches.k_cache, caches.g_cache))
    run = KernelRun(geometry={"H": geom.H, "HV": geom.HV, "K": geom.K, "V": geom.V, "L": L}, steps=n,
                    tolerance=LOW_PRECISION_TOLERANCE if low else FP32_TOLERANCE)
    fill_random(caches, gen)
    before = caches.clone()
    dense = caches.initial_state.float().clone()
    A_log = torch.randn(geom.HV, generator=gen) * 0.5
    dt_bias = torch.randn(geom.HV, geom.K, generator=gen)
    cursor = [0] * int(caches.initial_state.shape[0])  # the pool's persistent per-slot cursor
    forced_at = max(1, L - 2)  # cursor L - 2 (or 1): a step that would not flush by itself
    for step in range(n):
        x = random_step(geom, slots, gen)
        x.A_log, x.dt_bias, x.lower_bound = A_log, dt_bias, lower_bound
        write_pos = [cursor[max(s, 0)] for s in slots]  # padded rows read the padding slot's cursor
        bad = cursor_range(write_pos, slots, L)
        if bad:
            run.failure = bad[0]
            return run
        if step == forced_at:
            x.force_flush[0] = 1
        want = naive_step(dense, x, geom)
        got = replay_step(caches, x, write_pos, geom)
        run.output_error = max(run.output_error, relative_error(got, want))
        for row, slot in enumerate(slots):
            if slot < 0:
                if bool(got[row].abs().max() > 0):
                    run.padded_rows_zero = False
                continue
            forced = int(x.force_flush[row]) != 0
            flushed = write_pos[row] == L - 1 or forced
            run.flushes += flushed
            run.forced_flushes += forced and write_pos[row] != L - 1
            cursor[slot] = recipe.next_cursor(write_pos[row], L, flushed)
    group = geom.HV // geom.H
    occupied = sorted({s for s in slots if s >= 0})
    bad = cursor_range([cursor[s] for s in occupied], occupied, L)
    if bad:
        run.failure = bad[0]
        return run
    for slot in occupied:
        run.state_error = max(run.state_error, relative_error(reconstruct(caches, slot, cursor[slot], group),
                                                              dense[slot]))
    for slot in range(int(caches.initial_state.shape[0])):
        if slot in occupied:
            continue
        for name in ("initial_state", "d_cache", "k_cache", "g_cache"):
            if not torch.equal(getattr(caches, name)[slot], getattr(before, name)[slot]):
                run.untouched_slots_intact = False
    if not math.isfinite(run.output_error) or run.output_error > run.tolerance:
        run.problems.append(f"outputs differ from the recurrence by {run.output_error:.2e} (relative; "
                            f"tolerance {run.tolerance:.0e})")
    if not math.isfinite(run.state_error) or run.state_error > run.tolerance:
        run.problems.append(f"the state rebuilt from checkpoint + ring differs by {run.state_error:.2e}")
    if not run.padded_rows_zero:
        run.problems.append("a padded row's output is not zero")
    if not run.untouched_slots_intact:
        run.problems.append("a slot no row uses was modified")
    return run
