"""Drive real caches through the model's own mask routing and watch what each layer attends.

The mlx-lm skeleton runs its real container code (mask creation, layer loop); each layer's
attention child is swapped for `AttentionProbe`, which writes canary keys (value = absolute
position) into the cache it is handed and records the mask it got and who made it. Nothing
touches the model's weights: the hidden states flow through lazily and are never evaluated.

Schedule: a prefill of W + 3 tokens, an extend chunk of 2, three single-token decodes through
the native path, then two batched-decode steps (per-layer offset shims, trailing-window reads).
Invariants checked at every step, per attention layer, each broken one recorded as a `Problem` of
its kind (the rules in kvdoctor.checks.swa decide what each means):
  full_mask_from_window  no full-context mask is asked of a windowed cache that holds more than W tokens
  mask_width             the mask is as wide as the keys the layer's cache returned
  attended               the attended positions are exactly {p-W+1 .. p} (sliding) or {0 .. p} (full)
  offsets                every attention cache of the request reports the same absolute offset
  shim_store             nothing but the wrapped attention stores into the batched-decode offset shims
  wrapper_breaks_layer   the layer code works with its attention child replaced by the backend's wrapper
and `ProbeReport.ran` records which layers actually ran.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import msgspec
from msgspec.structs import replace
import numpy as np

from kvdoctor.engines.sglang_mlx.caches import (GROWTH_BLOCK, ContiguousKVCache, OffsetShim, WindowedKVCache, canary,
                                  positions_of)
from kvdoctor.engines.sglang_mlx.mlxlm import layer_list, qualified

PROBE_BYTES_BUDGET = 256 * 2**20  # cache memory above which most layers get compact canary caches
KERNEL_BUDGET = 40_000_000  # n * K * K above which attended sets come from the mask alone, not SDPA
FULL_SCHEDULE_WINDOW = 16  # prefill length - 3 when the model has no sliding layers
MAX_PREFILL_CHUNKS = 16
WRAPPER_CLASS = "MLXAttentionWrapper"


class ProbeLayer(msgspec.Struct, frozen=True):
    index: int
    attr: str
    window: int | None  # the window the engine applies to this layer (None: full attention)
    n_kv_heads: int
    head_dim: int
    dtype: str  # an mlx dtype name, e.g. "bfloat16"
    true_shape: bool = True  # False: 1 head x 3 lanes, same canaries (keeps big-window probes in memory)

    def kv_shape(self) -> tuple[int, int]:
        return (self.n_kv_heads, self.head_dim) if self.true_shape else (1, min(3, self.head_dim))


class Problem(msgspec.Struct):
    kind: str  # which invariant broke (see the module docstring)
    stage: str  # "prefill" or "decode"
    step: str
    layer: int | None
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


class ProbeReport(msgspec.Struct):
    steps: list[str] = msgspec.field(default_factory=list)
    problems: list[Problem] = msgspec.field(default_factory=list)
    checked: int = 0  # (layer, step) pairs whose attended positions were verified
    kernel_checked: int = 0  # of those, how many were read back through mx.fast SDPA
    ran: set[int] = msgspec.field(default_factory=set)
    # step -> consumer layer -> (layer whose cache made its mask, the window that cache was asked for)
    routes: dict[str, dict[int, tuple[int, int | None] | None]] = msgspec.field(default_factory=dict)
    attended: dict[str, dict[int, int]] = msgspec.field(default_factory=dict)  # step -> layer -> keys its last query saw
    aborted: str | None = None
    bytes_written: int = 0


class TaggedCausal(str):
    """The string mask "causal" as a distinct object per request, so its consumers trace back to its maker."""


class _MaskMade(msgspec.Struct):
    maker: int
    window_size: int | None
    mask: Any


class _Seen(msgspec.Struct):
    layer: int
    mask: Any
    positions: Any  # numpy int array, one absolute position per returned key
    queries: range
    window: int | None
    batched: bool


class Recorder:
    """Observer of the caches and state shared by the attention probes during one step."""

    def __init__(self, layers: dict[int, ProbeLayer]):
        self.layers = layers
        self.report = ProbeReport()
        self.step = ""
        self.stage = ""
        self.made: list[_MaskMade] = []
        self.seen: list[_Seen] = []
        self.request_caches: dict[int, Any] = {}
        self.batched_offset: int | None = None
        self.true_offset = 0

    # -- observer protocol ------------------------------------------------------------------------
    def on_mask(self, cache: Any, n: int, window_size: int | None, mask: Any, refused: bool) -> Any:
        if isinstance(mask, str):
            mask = TaggedCausal(mask)
        self.made.append(_MaskMade(cache.layer, window_size, mask))
        if refused:
            self.report.problems.append(Problem("full_mask_from_window", self.stage, self.step, cache.layer, {
                "maker": cache.layer, "offset": cache.offset, "kept": cache.kept(), "window": cache.window,
                "queries": n}))
        return mask

    def on_shim_store(self, shim: OffsetShim, keys: Any) -> None:
        caller = _calling_module()
        self.report.problems.append(Problem("shim_store", self.stage, self.step, shim.layer, {
            "module": caller, "tokens": int(keys.shape[2])}))

    # -- called by AttentionProbe ------------------------------------------------------------------
    def attend(self, layer: int, x: Any, mask: Any, cache: Any) -> Any:
        spec = self.layers[layer]
        n = x.shape[1]
        self.report.ran.add(layer)
        if self.batched_offset is not None:
            own = self.request_caches[layer]
            p = self.batched_offset
            keys = canary(range(p, p + n), *spec.kv_shape(), _dtype(spec.dtype))
            own.write_token(keys, keys)
            fetched, _ = own.get_kv(spec.window)
            self.seen.append(_Seen(layer, None, positions_of(fetched), range(p, p + n), spec.window, True))
            return x
        start = cache.offset
        keys = canary(range(start, start + n), *spec.kv_shape(), _dtype(spec.dtype))
        fetched, _ = cache.update_and_fetch(keys, keys)
        queries = range(self.true_offset, self.true_offset + n)
        self.seen.append(_Seen(layer, mask, positions_of(fetched), queries, spec.window, False))
        return x

    def maker_of(self, mask: Any) -> tuple[int, int | None] | None:
        """(layer whose cache made this mask, window it was asked for), when it can be told."""
        if mask is not None:
            return next(((m.maker, m.window_size) for m in self.made if m.mask is mask), None)
        makers = {(m.maker, m.window_size) for m in self.made if m.mask is None}
        return makers.pop() if len(makers) == 1 else None


def _dtype(name: str) -> Any:
    import mlx.core as mx

    return getattr(mx, name)


def _calling_module() -> str | None:
    """The class of the nearest mlx Module on the stack that is storing into a shim."""
    import mlx.nn as nn

    for frame in inspect.stack()[2:12]:
        owner = frame.frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and not isinstance(owner, probe_class()):
            return qualified(owner)
    return None


@lru_cache(maxsize=1)
def probe_class() -> type:
    """The probe module class (built on first use so importing this module does not import mlx.nn)."""
    import mlx.nn as nn

    class AttentionProbe(nn.Module):
        """Stands where the backend's wrapper stands: same call signature, no other attributes."""

        def __init__(self, recorder: Recorder, layer: int):
            super().__init__()
            object.__setattr__(self, "_recorder", recorder)
            object.__setattr__(self, "_layer", layer)

        def __call__(self, x: Any, mask: Any = None, cache: Any = None) -> Any:
            return self._recorder.attend(self._layer, x, mask, cache)

    # A call with the wrong arguments is named by the method's qualified name: without the enclosing
    # function's, it is the wrapper's own text once its name replaces the probe's.
    AttentionProbe.__call__.__qualname__ = "AttentionProbe.__call__"
    return AttentionProbe


# ---- mask reading --------------------------------------------------------------------------------

def _allowed_from_mask(mask: Any, n: int, k: int) -> np.ndarray | None:
    """Which keys each query may attend, per the mask forms mlx SDPA accepts; None if incompatible."""
    if mask is None:
        return np.ones((n, k), dtype=bool)
    if isinstance(mask, str):
        rows = np.arange(n)[:, None] + (k - n)
        return np.arange(k)[None, :] <= rows
    import mlx.core as mx

    shape = mask.shape
    if shape[-1] != k or (len(shape) > 1 and shape[-2] not in (1, n)):
        return None
    arr = mask.reshape(-1, shape[-2] if len(shape) > 1 else 1, k)[0]
    values = np.array(arr.astype(mx.float32)) if arr.dtype != mx.bool_ else np.array(arr)
    allowed = values.astype(bool) if arr.dtype == mx.bool_ else values > -1e9
    return np.broadcast_to(allowed, (n, k))


def _allowed_by_kernel(mask: Any, n: int, k: int) -> np.ndarray:
    """Ask mx.fast.scaled_dot_product_attention itself: uniform scores, one-hot values per key slot."""
    import mlx.core as mx

    q = mx.zeros((1, 1, n, 8), dtype=mx.float32)
    keys = mx.zeros((1, 1, k, 8), dtype=mx.float32)
    values = mx.eye(k, dtype=mx.float32)[None, None]
    plain = None if mask is None else (str(mask) if isinstance(mask, str) else mask)
    out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=1.0, mask=plain)
    return np.array(out[0, 0]) > 0


def _ranges(values: list[int]) -> str:
    """1, 2, 3, 7 -> '1..3, 7'."""
    if not values:
        return "none"
    values = sorted(values)
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


class _Verifier:
    """Checks one step's records; memoises per mask so layers sharing a mask cost one kernel call."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.allowed: dict[tuple, np.ndarray | None] = {}
        self.verdicts: dict[tuple, dict | None] = {}

    def allowed_for(self, mask: Any, n: int, k: int) -> tuple[np.ndarray | None, bool]:
        key = (id(mask) if mask is not None else None, n, k)
        if key not in self.allowed:
            allowed = _allowed_from_mask(mask, n, k)
            by_kernel = False
            if allowed is not None and n * k * k <= KERNEL_BUDGET:
                allowed, by_kernel = _allowed_by_kernel(mask, n, k), True
            self.allowed[key] = (allowed, by_kernel)
        return self.allowed[key]

    def check(self, seen: _Seen) -> None:
        rec, report = self.recorder, self.recorder.report
        n, k = len(seen.queries), len(seen.positions)
        route = rec.maker_of(seen.mask) if not seen.batched else None
        report.routes.setdefault(rec.step, {})[seen.layer] = route
        maker = route[0] if route else None
        if seen.mask is not None and not isinstance(seen.mask, str):
            width = seen.mask.shape[-1]
            if width != k:
                report.problems.append(Problem("mask_width", rec.stage, rec.step, seen.layer, {
                    "mask_width": int(width), "keys": k, "maker": maker, "window": seen.window}))
                return
        allowed, by_kernel = self.allowed_for(seen.mask, n, k)
        if allowed is None:
            report.problems.append(Problem("mask_width", rec.stage, rec.step, seen.layer, {
                "mask_shape": list(seen.mask.shape), "keys": k, "maker": maker, "window": seen.window}))
            return
        report.checked += 1
        report.kernel_checked += int(by_kernel)
        report.attended.setdefault(rec.step, {})[seen.layer] = int(allowed[-1].sum())
        key = (id(allowed), seen.positions.tobytes(), seen.queries.start, n, seen.window)
        if key not in self.verdicts:
            self.verdicts[key] = _attended_problem(allowed, seen.positions, seen.queries, seen.window)
        verdict = self.verdicts[key]
        if verdict is not None:
            report.problems.append(Problem("attended", rec.stage, rec.step, seen.layer, {
                **verdict, "maker": maker, "window": seen.window, "batched": seen.batched}))


def _attended_problem(allowed: np.ndarray, pos: np.ndarray, queries: range,
                      window: int | None) -> dict | None:
    """None when every query attends exactly its expected positions; else the first query that does not."""
    q = np.asarray(queries)[:, None]
    expected = pos[None, :] <= q
    if window is not None:
        expected &= pos[None, :] > q - window
    want = np.minimum(q[:, 0] + 1, window) if window is not None else q[:, 0] + 1
    bad = np.nonzero((allowed != expected).any(axis=1) | ((allowed & expected).sum(axis=1) != want))[0]
    if not len(bad):
        return None
    row = int(bad[0])
    p = int(queries[row])
    got = [int(x) for x in pos[allowed[row]]]
    low = 0 if window is None else max(0, p - window + 1)
    return {"query": p, "attended": _ranges(got), "count": len(got), "expected": _ranges(list(range(low, p + 1))),
            "expected_count": p + 1 - low, "keys": _ranges([int(x) for x in pos])}


# ---- the driver ----------------------------------------------------------------------------------

def schedule(window: int | None, chunk: int) -> list[tuple[str, str, int, bool]]:
    """(step label, stage, tokens, batched) for the probe run.

    The prefill of W + 3 tokens is split into chunks of `chunk` tokens, as the scheduler splits long
    prompts (chunked prefill), but into at most MAX_PREFILL_CHUNKS pieces.
    """
    total = (window or FULL_SCHEDULE_WINDOW) + 3
    chunk = max(chunk, -(-total // MAX_PREFILL_CHUNKS))
    sizes = [min(chunk, total - start) for start in range(0, total, chunk)]
    if len(sizes) == 1:
        steps = [(f"prefill of {total} tokens", "prefill", total, False)]
    else:
        steps = [(f"prefill chunk {i}/{len(sizes)} ({n} tokens)", "prefill", n, False)
                 for i, n in enumerate(sizes, 1)]
    steps.append(("extend chunk of 2 tokens", "prefill", 2, False))
    steps += [(f"native decode {i}/3", "decode", 1, False) for i in (1, 2, 3)]
    steps += [(f"batched decode {i}/2", "decode", 1, True) for i in (1, 2)]
    return steps


def layer_bytes(layer: ProbeLayer, window: int | None) -> int:
    """Peak key + value bytes of one layer's probe cache with its true shape."""
    w = window or FULL_SCHEDULE_WINDOW
    tokens = 2 * w + 3 if layer.window is not None else w + 12 + GROWTH_BLOCK
    return 2 * tokens * layer.n_kv_heads * layer.head_dim * _dtype(layer.dtype).size


def probe_bytes(layers: list[ProbeLayer], chunk: int) -> int:
    """Peak bytes of the probe: every cache at its shape, plus one prefill chunk's mask and the numpy
    arrays it is compared through."""
    windows = sorted({layer.window for layer in layers if layer.window is not None})
    window = windows[0] if windows else None
    caches = sum(layer_bytes(layer if layer.true_shape else replace(layer, n_kv_heads=1,
                                                                    head_dim=min(3, layer.head_dim)), window)
                 for layer in layers)
    prefill = max(n for _, stage, n, _ in schedule(window, chunk) if stage == "prefill")
    return caches + 5 * prefill * ((window or FULL_SCHEDULE_WINDOW) + 3)


def within_budget(layers: list[ProbeLayer], budget: int = PROBE_BYTES_BUDGET) -> list[ProbeLayer]:
    """Keep every layer's true KV shape when the caches fit `budget`; else only the first layer of
    each window kind, the others carrying the same canaries in 1 head x 3 lanes."""
    windows = sorted({layer.window for layer in layers if layer.window is not None})
    window = windows[0] if windows else None
    if sum(layer_bytes(layer, window) for layer in layers) <= budget:
        return layers
    firsts = {next(l.index for l in layers if l.window == w) for w in {l.window for l in layers}}
    return [replace(l, true_shape=l.index in firsts) for l in layers]


def run_probes(model: Any, layers: list[ProbeLayer], num_layers: int, auxiliary: list[int],
               chunk: int = 8192) -> ProbeReport:
    """Run the schedule on `model` (an mlx-lm skeleton) with the engine's caches for `layers`;
    `chunk` is the deploy's chunked-prefill size."""
    import mlx.core as mx

    probe = probe_class()
    by_index = {layer.index: layer for layer in layers}
    recorder = Recorder(by_index)
    report = recorder.report
    windows = sorted({layer.window for layer in layers if layer.window is not None})
    modules = layer_list(model)
    originals = {}
    for layer in layers:
        originals[layer.index] = getattr(modules[layer.index], layer.attr)
        setattr(modules[layer.index], layer.attr, probe(recorder, layer.index))
    try:
        caches = {layer.index: (WindowedKVCache(layer.index, layer.window, recorder) if layer.window is not None
                                else ContiguousKVCache(layer.index, observer=recorder)) for layer in layers}
        recorder.request_caches = caches
        native = None
        for label, stage, n, batched in schedule(windows[0] if windows else None, chunk):
            recorder.step, recorder.stage = label, stage
            recorder.made, recorder.seen = [], []
            report.steps.append(label)
            offsets = {i: c.offset for i, c in caches.items()}
            if len(set(offsets.values())) > 1:
                report.problems.append(Problem("offsets", stage, label, None, {
                    "offsets": offsets, "first": layers[0].index, "true_offset": recorder.true_offset}))
            recorder.batched_offset = offsets[layers[0].index] if batched else None

            def forward() -> None:  # called at once, in this iteration: the loop variables it reads are current
                nonlocal native
                if native is None:  # the runner builds a request's cache list when its prefill starts
                    native = _skeleton_caches(model, num_layers, auxiliary)
                cache_list = list(native)
                for i, cache in caches.items():
                    cache_list[i] = OffsetShim(i, max(offsets.values()), recorder) if batched else cache  # noqa: B023
                model(mx.zeros((1, n), dtype=mx.int32), cache=cache_list)  # noqa: B023

            if not _run_model_code(forward, report, stage, label):
                return report
            verifier = _Verifier(recorder)
            for seen in recorder.seen:
                verifier.check(seen)
            mx.eval([c.state for c in caches.values()])
            recorder.true_offset += n
        report.bytes_written = sum(a.nbytes for c in caches.values() for a in c.state)
        return report
    finally:
        for index, original in originals.items():
            setattr(modules[index], by_index[index].attr, original)


def _run_model_code(call: Any, report: ProbeReport, stage: str, label: str) -> bool:
    """Run model code; an error that names the probe is the error the backend's wrapper would cause."""
    try:
        call()
        return True
    except (AttributeError, TypeError) as exc:
        text = str(exc)
        if "AttentionProbe" not in text:
            report.aborted = f"{type(exc).__name__}: {text} ({label})"
            return False
        report.problems.append(Problem("wrapper_breaks_layer", stage, label, None, {
            "class": type(exc).__name__, "message": text.replace("AttentionProbe", WRAPPER_CLASS)}))
        report.aborted = f"the model's layer code failed with the attention wrapper in place ({label})"
        return False
    except Exception as exc:  # noqa: BLE001 - the model code is arbitrary; report, don't crash
        report.aborted = f"{type(exc).__name__}: {exc} ({label})"
        return False


def _skeleton_caches(model: Any, num_layers: int, auxiliary: list[int]) -> list[Any]:
    """The model-shaped cache list before attention caches go in: mlx-lm's own for auxiliary layers."""
    if auxiliary and hasattr(model, "make_cache"):
        made = list(model.make_cache())
        if len(made) == num_layers:
            return made
    return [None] * num_layers
