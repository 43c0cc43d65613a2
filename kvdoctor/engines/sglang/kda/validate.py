"""The decode wrappers' input checks, replayed in their order with their exact messages, plus the
invariants the kernels rely on but do not check.

`helion_wrapper` follows sglang 0.5.23's `helion_fused_recurrent_kda_replayssm_decode` (which first
runs `validate_packed_decode_inputs`); `triton_wrapper` follows the Triton twin
`fused_recurrent_linear_replayssm_decode(..., is_kda=True)`. Each returns the first failure, as the
engine raises only the first. A failure names the check it failed (one name where two wrappers' messages
mean the same thing); the KDA rule turns the name into a catalog code.
"""
from __future__ import annotations

from typing import Callable, Optional

import msgspec

from kvdoctor.engines.sglang.kda.caches import Caches, DecodeInputs

TRITON_NK = 2  # the K split the sglang call site leaves at its default


class Failure(msgspec.Struct, frozen=True):
    check: str  # which of the engine's checks (or the unchecked invariants) failed
    message: str
    error_class: str = "ValueError"


def _dim_error(fn: Callable[[], object]) -> Optional[str]:
    """The IndexError text torch gives when a cache lacks a dimension the wrapper reads."""
    try:
        fn()
    except IndexError as exc:
        return str(exc)
    return None


def packed_checks(mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices):
    """sglang's `validate_packed_decode_inputs`: a Failure, or (B, H, HV, K, V) inferred from the inputs."""
    if mixed_qkv.ndim != 2:
        return Failure("kda-mixed-qkv-rank", f"`mixed_qkv` must be a 2D tensor (got ndim={mixed_qkv.ndim}).")
    if mixed_qkv.stride(-1) != 1:
        return Failure("kda-mixed-qkv-stride", "`mixed_qkv` must be contiguous in the last dim.")
    if a.ndim != 2 or b.ndim != 2:
        return Failure("kda-a-b-rank", f"`a` and `b` must be 2D tensors (got a.ndim={a.ndim}, b.ndim={b.ndim}).")
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        return Failure("kda-a-b-stride", "`a`/`b` must be contiguous in the last dim.")
    if A_log.ndim != 1 or dt_bias.ndim != 1:
        return Failure("kda-a-log-rank", "`A_log`/`dt_bias` must be 1D tensors.")
    if A_log.stride(0) != 1 or dt_bias.stride(0) != 1:
        return Failure("kda-a-log-stride", "`A_log`/`dt_bias` must be contiguous.")
    if ssm_state_indices.ndim != 1:
        return Failure("kda-state-indices-rank", "`ssm_state_indices` must be 1D for packed decode "
                       f"(got ndim={ssm_state_indices.ndim}).")
    if not out.is_contiguous():
        return Failure("kda-out-contiguous", "`out` must be contiguous.")
    device = mixed_qkv.device
    if any(t.device != device for t in (a, b, A_log, dt_bias, initial_state, out, ssm_state_indices)):
        return Failure("kda-inputs-device", "All inputs must be on the same device.")
    B = mixed_qkv.shape[0]
    if a.shape[0] != B or b.shape[0] != B:
        return Failure("kda-batch-mismatch", f"Mismatched batch sizes: mixed_qkv.shape[0]={B}, a.shape[0]={a.shape[0]}, "
                       f"b.shape[0]={b.shape[0]}.")
    if ssm_state_indices.shape[0] != B:
        return Failure("kda-state-indices-batch", f"`ssm_state_indices` must have shape [B] (got {tuple(ssm_state_indices.shape)}; "
                       f"expected ({B},)).")
    if initial_state.ndim != 4:
        return Failure("kda-state-rank", f"`initial_state` must be a 4D tensor (got ndim={initial_state.ndim}).")
    if initial_state.stride(-1) != 1:
        return Failure("kda-state-stride", "`initial_state` must be contiguous in the last dim.")
    HV, V, K = (int(d) for d in initial_state.shape[-3:])
    if not _power_of_two(K) or not _power_of_two(V):
        return Failure("helion-kda-power-of-two", "Helion KDA decode requires power-of-two key and value head dimensions "
                       f"(got K={K}, V={V}).")
    if a.shape[1] != HV * K:
        return Failure("kda-a-shape", f"`a` must have shape [B, HV*K] with HV={HV}, K={K} (got a.shape={tuple(a.shape)}).")
    if b.shape[1] != HV:
        return Failure("kda-b-shape", f"`b` must have shape [B, HV] with HV={HV} (got b.shape={tuple(b.shape)}).")
    if A_log.numel() != HV:
        return Failure("kda-a-log-numel", f"`A_log` must have {HV} elements (got {A_log.numel()}).")
    if dt_bias.numel() != HV * K:
        return Failure("kda-dt-bias-numel", f"`dt_bias` must have {HV * K} elements (got {dt_bias.numel()}).")
    if out.shape != (B, 1, HV, V):
        return Failure("kda-out-shape", f"`out` must have shape {(B, 1, HV, V)} (got out.shape={tuple(out.shape)}).")
    qkv_dim = mixed_qkv.shape[1]
    qk_dim = qkv_dim - HV * V
    if qk_dim <= 0 or qk_dim % 2 != 0:
        return Failure("kda-packed-width", f"Invalid packed `mixed_qkv` last dim={qkv_dim} for HV={HV}, V={V}.")
    q_dim = qk_dim // 2
    if q_dim % K != 0:
        return Failure("kda-packed-q-size", f"Invalid packed Q size {q_dim}: must be divisible by K={K}. KDA packed decode "
                       "requires num_q_heads == num_k_heads and head_q_dim == head_k_dim.")
    H = q_dim // K
    if H <= 0 or HV % H != 0:
        return Failure("kda-head-grouping", f"Invalid head config inferred from mixed_qkv: H={H}, HV={HV}.")
    return B, H, HV, K, V


def helion_wrapper(x: DecodeInputs, c: Caches) -> Optional[Failure]:
    """The Helion ReplaySSM wrapper's checks, in order; None when the kernel would launch."""
    import torch

    a, dt_bias = x.a, x.dt_bias
    batch = x.mixed_qkv.size(0)
    if a.ndim not in (2, 3) or not a.is_contiguous():
        return Failure("kda-a-layout", "KDA `a` must be a contiguous 2D or 3D tensor.")
    if dt_bias.ndim not in (1, 2) or not dt_bias.is_contiguous():
        return Failure("kda-dt-bias-layout", "KDA `dt_bias` must be a contiguous 1D or 2D tensor.")
    inferred = packed_checks(x.mixed_qkv, a.view(batch, -1), x.b, x.A_log, dt_bias.view(-1), c.initial_state,
                             x.out, x.ssm_state_indices)
    if isinstance(inferred, Failure):
        return inferred
    _, H, HV, K, V = inferred
    write_pos, force_flush = c.write_pos, c.force_flush
    if write_pos.ndim != 1 or write_pos.dtype is not torch.int32:
        return Failure("replayssm-write-pos-dtype", "`write_pos` must be a 1D int32 tensor.")
    if write_pos.shape != (batch,):
        return Failure("replayssm-write-pos-shape", f"`write_pos` must have shape {(batch,)}.")
    if force_flush is not None and (force_flush.ndim != 1 or force_flush.dtype is not torch.int32
                                    or force_flush.shape != (batch,)):
        return Failure("replayssm-force-flush-layout", "`force_flush` must be a length-B int32 tensor or None.")
    missing = _dim_error(lambda: c.d_cache.size(2))
    if missing:
        return Failure("replayssm-d-cache-shape", missing, "IndexError")
    L = c.d_cache.size(2)
    if L < 1:
        return Failure("replayssm-cache-length-zero", "ReplaySSM cache length must be at least 1.")
    if c.d_cache.shape[1:] != (HV, L, V):
        return Failure("replayssm-d-cache-shape", "`d_cache` must have shape [slots, HV, L, V].")
    if c.k_cache.shape[1:] != (H, L, K):
        return Failure("replayssm-k-cache-shape", "`k_cache` must have shape [slots, H, L, K].")
    if c.g_cache.shape[1:] != (HV, L, K):
        return Failure("replayssm-g-cache-shape", "`g_cache` must have shape [slots, HV, L, K].")
    if c.g_cache.dtype is not torch.float32:
        return Failure("replayssm-g-cache-dtype", "`g_cache` must have dtype torch.float32.")
    device = x.mixed_qkv.device
    if any(t.device != device for t in (c.d_cache, c.k_cache, c.g_cache, write_pos)):
        return Failure("replayssm-ring-device", "ReplaySSM inputs must be on the same device.")
    if force_flush is not None and force_flush.device != device:
        return Failure("replayssm-force-flush-device", "`force_flush` must be on the same device as the inputs.")
    return None


def triton_wrapper(x: DecodeInputs, c: Caches, nk: int = TRITON_NK) -> Optional[Failure]:
    """The Triton twin's checks (is_kda=True), in order; None when the kernel would launch."""
    import torch

    mixed_qkv, a, b, dt_bias, out = x.mixed_qkv, x.a, x.b, x.dt_bias, x.out
    state, write_pos, force_flush = c.initial_state, c.write_pos, c.force_flush
    if mixed_qkv.ndim != 2:
        return Failure("kda-mixed-qkv-rank", f"`mixed_qkv` must be 2D (got ndim={mixed_qkv.ndim}).")
    if mixed_qkv.stride(-1) != 1:
        return Failure("kda-mixed-qkv-stride", "`mixed_qkv` must be contiguous in the last dim.")
    if b.ndim != 2:
        return Failure("kda-a-b-rank", f"`b` must be 2D (got b.ndim={b.ndim}).")
    if x.A_log.ndim != 1:
        return Failure("kda-a-log-rank", "`A_log` must be a 1D tensor.")
    if state.ndim != 4:
        return Failure("kda-state-rank", f"`initial_state` must be 4D (got ndim={state.ndim}).")
    if not out.is_contiguous():
        return Failure("kda-out-contiguous", "`out` must be contiguous.")
    if write_pos.ndim != 1 or write_pos.dtype != torch.int32:
        return Failure("replayssm-write-pos-dtype", "`write_pos` must be a 1D int32 tensor.")
    if force_flush is not None and (force_flush.ndim != 1 or force_flush.dtype != torch.int32):
        return Failure("replayssm-force-flush-layout", "`force_flush` must be a 1D int32 tensor or None.")
    B = mixed_qkv.shape[0]
    _, HV, V, K = (int(d) for d in state.shape)
    qkv_dim = mixed_qkv.shape[1]
    q_dim = (qkv_dim - HV * V) // 2
    if q_dim <= 0 or q_dim % K != 0:
        return Failure("kda-packed-width", f"Invalid packed `mixed_qkv` last dim={qkv_dim} for HV={HV}, V={V}, K={K}.")
    H = q_dim // K
    if H <= 0 or HV % H != 0:
        return Failure("kda-head-grouping", f"Invalid head config inferred from mixed_qkv: H={H}, HV={HV}.")
    missing = _dim_error(lambda: c.d_cache.shape[2])
    if missing:
        return Failure("replayssm-d-cache-shape", missing, "IndexError")
    L = int(c.d_cache.shape[2])
    if a.ndim != 3 or tuple(a.shape) != (B, HV, K):
        return Failure("kda-a-shape", f"KDA `a` must have shape {(B, HV, K)} (got {tuple(a.shape)}).")
    if dt_bias.ndim != 2 or tuple(dt_bias.shape) != (HV, K):
        return Failure("kda-dt-bias-numel", f"KDA `dt_bias` must have shape {(HV, K)} (got {tuple(dt_bias.shape)}).")
    if not a.is_contiguous() or not dt_bias.is_contiguous():
        return Failure("kda-triton-gate-contiguous", "KDA `a`/`dt_bias` must be contiguous.")
    if tuple(c.d_cache.shape[1:]) != (HV, L, V):
        return Failure("replayssm-d-cache-shape", f"`d_cache` per-slot shape must be {(HV, L, V)} (got {tuple(c.d_cache.shape[1:])}).")
    if tuple(c.k_cache.shape[1:]) != (H, L, K):
        return Failure("replayssm-k-cache-shape", f"`k_cache` per-slot shape must be {(H, L, K)} (got {tuple(c.k_cache.shape[1:])}).")
    if tuple(c.g_cache.shape[1:]) != (HV, L, K):
        return Failure("replayssm-g-cache-shape", f"`g_cache` per-slot shape must be {(HV, L, K)} (got {tuple(c.g_cache.shape[1:])}).")
    if c.g_cache.dtype != torch.float32:
        return Failure("replayssm-g-cache-dtype", f"`g_cache` must be float32 (got {c.g_cache.dtype}).")
    if out.shape != (B, 1, HV, V):
        return Failure("kda-out-shape", f"`out` must have shape {(B, 1, HV, V)} (got {tuple(out.shape)}).")
    if write_pos.shape[0] != B or x.ssm_state_indices.shape[0] != B:
        return Failure("replayssm-write-pos-shape", f"`write_pos` and `ssm_state_indices` must both have length B={B} "
                       f"(got {write_pos.shape[0]}, {x.ssm_state_indices.shape[0]}).")
    BK = _next_power_of_two(K)
    if BK % nk != 0:
        return Failure("kda-triton-key-tiling", f"nk={nk} must divide BK={BK}.")
    if BK // nk < 16:
        return Failure("kda-triton-key-tiling", f"BKT={BK // nk} must be >=16 for tl.dot (nk={nk}, BK={BK}).")
    return None


WRAPPERS = {"helion": helion_wrapper, "triton": triton_wrapper}


def invariants(x: DecodeInputs, c: Caches) -> list[Failure]:
    """What the kernels assume without checking: one slot count for state and rings, every row's slot
    inside it, and every row's cursor inside the ring (0..L-1)."""
    found: list[Failure] = []
    named = {"initial_state": c.initial_state, "d_cache": c.d_cache, "k_cache": c.k_cache, "g_cache": c.g_cache}
    slots = {name: int(t.shape[0]) for name, t in named.items() if t.ndim >= 1}
    if len(set(slots.values())) > 1:
        found.append(Failure("replayssm-slot-dims-differ", "the slot dimension differs between the state and its rings ("
                             + ", ".join(f"{n} {s}" for n, s in slots.items())
                             + "); the kernel indexes all four with the same slot id", "silent"))
    rows = [int(i) for i in x.ssm_state_indices.reshape(-1).tolist()]
    if slots:
        smallest = min(slots, key=slots.get)
        bad = [i for i in rows if i >= slots[smallest]]
        if bad:
            found.append(Failure("replayssm-slot-index-out-of-range", f"a decode row uses slot {bad[0]} but {smallest} has only "
                                 f"{slots[smallest]} slots (0..{slots[smallest] - 1})", "silent"))
    if c.d_cache.ndim >= 3 and c.write_pos.ndim == 1 and c.write_pos.shape[0] == len(rows):
        found.extend(cursor_range(c.write_pos.tolist(), rows, int(c.d_cache.shape[2])))
    return found


def cursor_range(write_pos: list[int], rows: list[int], L: int) -> list[Failure]:
    bad = [(wp, s) for wp, s in zip(write_pos, rows) if s >= 0 and not 0 <= int(wp) <= L - 1]
    if not bad:
        return []
    wp, slot = bad[0]
    return [Failure("replayssm-cursor-out-of-range", f"write_pos = {int(wp)} for slot {slot} is outside 0..{L - 1} "
                    f"(L = {L}): the step never flushes, drops its ring row and replays rows past the ring", "silent")]


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
