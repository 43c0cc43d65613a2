"""Watch the engine run without changing what it computes.

- `AttentionRecorder` wraps `mx.fast.scaled_dot_product_attention` for the length of a dry run. Every
  call is passed through unchanged; on the side it counts, for each query, how many keys the call
  let it attend (from the key length and the mask exactly as given), and tags the call with the layer
  whose `MLXAttentionWrapper` is running and the positions the driver is feeding.
- `CodeTracer` records which functions of the engine's files ran (a profile hook on Python calls), so
  a report can say which part was the engine's own code.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec


def keys_per_query(batch: int, queries: int, keys: int, mask: Any) -> list[list[int]]:
    """Keys each query may attend, [batch][query], for an SDPA call's mask argument.

    mask None: every key; "causal": lower-right aligned causal (query i sees keys - queries + i + 1);
    a boolean array: True entries; an additive float array: finite entries. Array masks broadcast over
    (batch, heads, queries, keys); all heads must agree (a per-head mask is counted on head 0).
    """
    import numpy as np

    if mask is None:
        return [[keys] * queries for _ in range(batch)]
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown SDPA mask mode {mask!r}")
        return [[max(0, min(keys, keys - queries + i + 1)) for i in range(queries)] for _ in range(batch)]
    import mlx.core as mx

    array = mask if mask.dtype == mx.bool_ else mask.astype(mx.float32)
    values = np.array(array)
    allowed = values if values.dtype == np.bool_ else np.isfinite(values) & (values > -1e30)
    while allowed.ndim < 4:
        allowed = allowed[None]
    allowed = np.broadcast_to(allowed, (batch, allowed.shape[1], queries, keys))[:, 0]
    return allowed.sum(axis=-1).astype(int).tolist()


def summarize(counts: list[list[int]], rows: list[tuple[int, int]]) -> dict[str, Any]:
    """Compare the observed counts with causal attention at the fed positions.

    rows[b] = (offset, length): the absolute position of row b's first query and how many it has.
    The call's pattern is "causal" when every query at position p saw p+1 keys, "window" when every
    query saw min(W, p+1) for one W smaller than some p+1, else "irregular" (first offender given).
    """
    observed, positions = [], []
    for row_counts, (offset, _length) in zip(counts, rows):
        observed.extend(row_counts)
        positions.extend(range(offset, offset + len(row_counts)))
    summary: dict[str, Any] = {"queries": len(observed), "max_keys": max(observed, default=0),
                               "min_keys": min(observed, default=0),
                               "last_keys": [c[-1] for c in counts],
                               "positions": [[o, o + n - 1] for o, n in rows]}
    if all(c == p + 1 for c, p in zip(observed, positions)):
        summary["pattern"] = "causal"
        return summary
    window = max(observed)
    if all(c == min(window, p + 1) for c, p in zip(observed, positions)):
        summary.update(pattern="window", window=window)
        return summary
    for c, p in zip(observed, positions):
        if c != p + 1 and c != min(window, p + 1):
            summary.update(pattern="irregular", first_irregular={"position": p, "keys": c})
            break
    return summary


class AttentionRecorder(msgspec.Struct):
    """Counts attended keys per SDPA call; `emit` receives one summary dict per call."""

    emit: Callable[[dict[str, Any]], None]
    stage: str = "startup"
    rows: list[tuple[int, int]] = msgspec.field(default_factory=list)
    step: int = 0
    layer: int | None = None
    error_layer: int | None = None  # the attention layer running when an exception went through it
    calls: int = 0

    def feed(self, stage: str, rows: list[tuple[int, int]], step: int = 0) -> None:
        """Say what the driver is about to run: the stage and each batch row's (offset, length)."""
        self.stage, self.rows, self.step = stage, rows, step

    @contextmanager
    def installed(self, wrapper_class: type) -> Iterator[None]:
        """Wrap SDPA and the engine's attention wrapper call for the duration of the block."""
        import mlx.core as mx

        original_sdpa = mx.fast.scaled_dot_product_attention
        original_call = wrapper_class.__call__
        recorder = self

        def sdpa(queries, keys, values, *args, **kwargs):
            out = original_sdpa(queries, keys, values, *args, **kwargs)
            recorder._record(queries.shape, keys.shape, kwargs.get("mask"))
            return out

        def call(module, *args, **kwargs):
            outer, recorder.layer = recorder.layer, getattr(module, "_layer_idx", None)
            try:
                return original_call(module, *args, **kwargs)
            except BaseException:
                if recorder.error_layer is None:
                    recorder.error_layer = recorder.layer
                raise
            finally:
                recorder.layer = outer

        mx.fast.scaled_dot_product_attention = sdpa
        wrapper_class.__call__ = call
        try:
            yield
        finally:
            mx.fast.scaled_dot_product_attention = original_sdpa
            wrapper_class.__call__ = original_call

    def _record(self, q_shape: tuple[int, ...], k_shape: tuple[int, ...], mask: Any) -> None:
        batch, heads, queries, head_dim = q_shape
        keys = k_shape[-2]
        counts = keys_per_query(batch, queries, keys, mask)
        rows = self.rows if len(self.rows) == batch else [(keys - queries, queries)] * batch
        self.calls += 1
        self.emit({"event": "attention", "layer": self.layer, "stage": self.stage, "step": self.step,
                   "batch": batch, "heads": heads, "kv_heads": k_shape[1], "head_dim": head_dim,
                   "key_len": keys, "mask": _mask_kind(mask), **summarize(counts, rows)})


def _mask_kind(mask: Any) -> str:
    if mask is None:
        return "none"
    if isinstance(mask, str):
        return mask
    return f"array{tuple(mask.shape)}:{str(mask.dtype).removeprefix('mlx.core.')}"


class CodeTracer:
    """Records (file, function) for every Python function that runs under the given package roots."""

    def __init__(self, roots: dict[str, Path]):
        self.roots = {label: str(path) + "/" for label, path in roots.items()}
        self.ran: dict[str, set[str]] = {}
        self._seen: set[Any] = set()

    def _profile(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile signature
        if event != "call":
            return
        code = frame.f_code
        if code in self._seen:
            return
        self._seen.add(code)
        filename = code.co_filename
        for label, root in self.roots.items():
            if filename.startswith(root):
                self.ran.setdefault(f"{label}/{filename[len(root):]}", set()).add(code.co_qualname)
                return

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(previous)

    def files(self) -> dict[str, list[str]]:
        return {name: sorted(functions) for name, functions in sorted(self.ran.items())}
