"""The dry run itself, inside the child process: the engine's own runner on a shrunk, random model.

Stages, in order; the first exception ends the run and is reported with its stage:
- load: the engine's remote-code gate on the model directory, then the weightless full-size model and
  a shrunk copy with the same signature (shrink.py), with fewer heads and layers where that is proven
  (compact.py);
- startup: sglang's `MlxModelRunner.__init__` and `init_cache_pools`, as its TP worker calls them with
  server defaults (mlx-lm's `load` is the one engine call replaced: it hands over the shrunk model);
- prefill: a request's cache list built as the runner builds it when a request arrives, then one
  request prefilled in chunks of W-1, 1, 1, W and W+5 tokens (a prefill then extends), a second
  request prefilled in one chunk of W-2;
- decode: batched decode steps of both requests, then their release.

Every event goes to `emit` as a JSON-able dict as soon as it happens, so a run stopped by the
parent's time bound still reports how far it got.
"""
from __future__ import annotations

import os
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec

from kvdoctor.engines.sglang_mlx.dryrun import compact, shrink
from kvdoctor.engines.sglang_mlx.dryrun.engine_import import PINNED, EngineUnavailable, load_mlx_backend
from kvdoctor.engines.sglang_mlx.dryrun.instrument import AttentionRecorder, CodeTracer

Emit = Callable[[dict[str, Any]], None]

SEED = 20251129
NOMINAL_UNIT = 8  # chunk unit for models the engine runs without any window
MINIMAL_UNIT = 3  # the last resort: the same shape of schedule with the fewest tokens
DECODE_STEPS = 4
# The up-front cost model, measured with MLX on a shared 2-core CPU (netlib BLAS, half precision):
# every forward pass pays for reading each weight once (half-precision matrix-vector products run at
# memory speed or worse), plus its multiply-adds. A run estimated past the budget is cut down to a
# shorter schedule before it starts; the child's hard time bound (run.py) stops the rest.
MACS_PER_SECOND = 0.8e9
SECONDS_PER_WEIGHT = 3e-9
DEFAULT_BUDGET_SECONDS = 45.0
# The dry run's process stays within 2 GiB: about half a GiB of imported engine, the rest for the copy's
# weights, its caches and the attention scores (docs/performance.md).
DEFAULT_BUDGET_BYTES = 3 * 1024**3 // 2
# Peak resident memory per byte of the engine's cache buffers, measured: its contiguous caches are
# written by slice assignment, and under MLX's lazy evaluation old and new buffers live together
# (gemma-2-2b: 1.7 GB of buffers, 7.2 GB peak); windowed caches are rebuilt far less often (OLMo 3:
# 3.7 GB of buffers, 4.1 GB peak).
CONTIGUOUS_COPIES = 4.0
WINDOWED_COPIES = 1.25

MODELLED = [
    "weights: mlx-lm's loader builds the model from config.json with no weight files; the shrunk copy "
    "gets random weights from a fixed seed (mlx_lm.load is the one runner call replaced)",
    "memory: MLX's buffer cache is capped at 0.25 GB through the engine's own SGLANG_MLX_CACHE_LIMIT_GB "
    "unless the environment sets it",
    "scheduler: kvdoctor feeds the runner a fixed request schedule with sequential pool slots; no "
    "TokenToKVPoolAllocator, RadixCache, prefix hits or auxiliary-state snapshots",
    "platform: runtime.py's Torch-MPS / Metal gate and the sgl_kernel.metal AOT kernels cannot run "
    "off macOS; the runner's own CPU fallbacks (mx.fast.rope) ran instead",
    "platform: MLX's CPU gather_mm (mixture-of-experts matmul) takes float32 only; kvdoctor computes it "
    "in float32 and casts the result back to the activation dtype, as the Metal kernel would return it",
]


class Step(msgspec.Struct):
    stage: str  # "prefill" or "decode"
    call: str  # runner method: prefill, extend, decode_batch
    requests: list[str]
    lengths: list[int]  # new tokens per request
    needs_logits: bool = True


class Schedule(msgspec.Struct):
    unit: int  # the window W the chunks are cut around
    crosses: bool  # False: a short schedule that stays inside the window
    steps: list[Step] = msgspec.field(default_factory=list)

    def tokens(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for step in self.steps:
            for req, n in zip(step.requests, step.lengths):
                total[req] = total.get(req, 0) + n
        return total


def make_schedule(unit: int, crosses: bool, max_chunk: int, decode_steps: int = DECODE_STEPS) -> Schedule:
    """Request A: chunks W-1, 1, 1, W, W+5 (each split at the chunked-prefill size); request B: one
    prefill of W-2; then batched decode steps of both."""
    schedule = Schedule(unit=unit, crosses=crosses)
    chunks = [unit - 1, 1, 1, unit, unit + 5]
    pieces = []
    for chunk in chunks:
        while chunk > 0:
            pieces.append(min(chunk, max_chunk))
            chunk -= pieces[-1]
    for i, n in enumerate(pieces):
        schedule.steps.append(Step("prefill", "prefill" if i == 0 else "extend", ["A"], [n],
                                   needs_logits=i == len(pieces) - 1))
    schedule.steps.append(Step("prefill", "prefill", ["B"], [max(1, min(unit - 2, max_chunk))]))
    for _ in range(decode_steps):
        schedule.steps.append(Step("decode", "decode_batch", ["A", "B"], [1, 1]))
    return schedule


def weight_summary(model: Any) -> dict[str, int]:
    """Bytes of all parameters and multiply-adds per token (every non-embedding weight once: an upper
    bound for mixtures of experts). Read before the runner wraps attention, which hides the inner
    modules' parameters from the tree."""
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    return {"weight_bytes": sum(v.nbytes for _, v in params),
            "macs_per_token": sum(v.size for name, v in params if "embed" not in name)}


def estimate(schedule: Schedule, weights: dict[str, int], layout: Any, heads: dict[int, tuple[int, int, int]],
             dtype_bytes: int) -> dict[str, int]:
    """Multiply-adds and peak bytes the schedule will need: weights, caches, and the largest attention
    score matrix SDPA materialises on CPU."""
    weight_bytes, per_token = weights["weight_bytes"], weights["macs_per_token"]
    macs, peak_scores, forwards = 0, 0, 0
    lengths: dict[str, int] = {}
    for step in schedule.steps:
        forwards += 1
        for req, n in zip(step.requests, step.lengths):
            offset = lengths.get(req, 0)
            macs += n * per_token
            for layer, (n_heads, _kv, head_dim) in heads.items():
                window = layout.window_size(layer)
                keys = offset + n if window is None else min(offset, window) + n
                macs += 2 * n * keys * n_heads * head_dim
                peak_scores = max(peak_scores, 4 * n * keys * n_heads * len(step.requests))
            lengths[req] = offset + n
    cache_bytes = 0
    for layer, (_heads, kv_heads, head_dim) in heads.items():
        window = layout.window_size(layer)
        for total in lengths.values():
            # contiguous buffers start at the engine's 4096 slots; windowed ones hold W + max(chunk, W)
            if window is None:
                slots, copies = max(4096, total), CONTIGUOUS_COPIES
            else:
                slots, copies = window + max(window, total), WINDOWED_COPIES
            cache_bytes += int(2 * kv_heads * head_dim * slots * dtype_bytes * copies)
    seconds = macs / MACS_PER_SECOND + forwards * per_token * SECONDS_PER_WEIGHT
    return {"seconds": seconds, "macs": macs, "forwards": forwards, "weight_bytes": weight_bytes,
            "cache_bytes": cache_bytes,
            "score_bytes": peak_scores, "peak_bytes": weight_bytes + cache_bytes + peak_scores}


def engine_frame(exc: BaseException, roots: dict[str, Path]) -> tuple[dict | None, dict | None]:
    """The deepest traceback frame inside an engine package, and the deepest frame overall."""
    frames = traceback.extract_tb(exc.__traceback__)
    engine = None
    for frame in frames:
        for label, root in roots.items():
            if frame.filename.startswith(str(root) + "/"):
                engine = {"file": f"{label}/{frame.filename[len(str(root)) + 1:]}", "line": frame.lineno,
                          "function": frame.name}
    origin = None
    if frames:
        last = frames[-1]
        origin = {"file": last.filename, "line": last.lineno, "function": last.name}
    return engine, origin


class DryRun:
    """One dry run of one model; `run()` never raises, it emits an `error` event instead."""

    def __init__(self, request: dict[str, Any], emit: Emit):
        self.request = request
        self.emit = emit
        self.stage: str | None = None
        self.backend = None
        self.recorder: AttentionRecorder | None = None
        self.roots: dict[str, Path] = {}
        self.fewer_heads = True  # try the fewer-heads copy (compact.py) first
        self.scaled_heads = False  # whether the copy in use has fewer heads
        self.copy: str | None = None  # the copy in use, named where it has fewer heads or layers
        self.discovery_error: str | None = None  # the engine's layer discovery refusing the full model
        self.raised: str | None = None  # the last engine error, as "Class: message"

    def _enter(self, stage: str) -> None:
        """Close the current stage as passed and open the next one."""
        if stage == self.stage:
            return
        if self.stage is not None:
            self.emit({"event": "stage", "stage": self.stage, "status": "ok"})
        self.stage = stage
        self.emit({"event": "stage", "stage": stage, "status": "started"})

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.backend = load_mlx_backend()
        except EngineUnavailable as exc:
            self.emit({"event": "engine_unavailable", "reason": str(exc)})
            return
        import mlx_lm

        self.roots = {"sglang": self.backend.root, "mlx_lm": Path(mlx_lm.__file__).parent}
        self.emit({"event": "versions", "versions": self.backend.versions, "pinned": dict(PINNED),
                   "modelled": MODELLED + [f"stand-in: {s}" for s in self.backend.stand_ins]})
        tracer = CodeTracer(self.roots)
        try:
            with tracer.installed(), float32_gather_mm():
                error = self._attempt()
                if error is not None and self.scaled_heads and self.raised != self.discovery_error:
                    self._repeat_with_full_heads(error)
                elif error is not None:
                    self.emit(error)
        finally:
            self.emit({"event": "engine_code", "files": tracer.files()})
            self.emit({"event": "done", "seconds": round(time.monotonic() - started, 2)})

    def _repeat_with_full_heads(self, error: dict[str, Any]) -> None:
        """The engine raised on the copy with fewer heads. Its message may name sizes (an rms_norm over
        all heads, say), so the run is repeated with the full head count (the proven cut to fewer layers
        stays) and that run is reported (run.py keeps only the events after its restart). Where the repeat
        stops short of raising (past the memory bound, refused a schedule), the first error stands. It is
        sent first, so that a repeat stopped by the time bound leaves it too."""
        self.emit(error)
        events: list[dict[str, Any]] = []
        emit, self.emit = self.emit, events.append
        self.fewer_heads, self.stage, self.recorder = False, None, None
        try:
            again = self._attempt()
        finally:
            self.emit = emit
        if again is None and any(e["event"] == "refused" for e in events):
            return
        self.emit({"event": "restart", "reason": "the engine raised on the copy with fewer heads; "
                   "repeated with the full head count"})
        for event in events + ([again] if again is not None else []):
            self.emit(event)

    def _attempt(self) -> dict[str, Any] | None:
        """The stages once; the engine's error as an `error` event when it raised, else None."""
        try:
            if self._stages():
                self.emit({"event": "stage", "stage": self.stage, "status": "ok"})
            return None
        except Exception as exc:  # every engine failure is a result, reported with its stage
            engine, origin = engine_frame(exc, self.roots)
            self.raised = f"{type(exc).__name__}: {exc}"
            return {"event": "error", "stage": self.stage or "load", "class": type(exc).__name__,
                    "message": str(exc), "frame": engine, "origin": origin,
                    "copy": None if self.raised == self.discovery_error else self.copy,  # else the full model's own
                    "layer": self.recorder.error_layer if self.recorder else None}

    # -- stages -----------------------------------------------------------------------------------

    def _stages(self) -> bool:
        """Run the stages in order; False when the run was refused before the end."""
        import mlx.core as mx

        request = self.request
        model_dir = Path(request["model_dir"])
        config = request["config"]
        trust = bool(request.get("trust_remote_code"))
        gate = self.backend.remote_code_gate
        self._enter("load")
        gate.ensure_remote_code_allowed(model_dir, trust)
        model_file = config.get("model_file") if trust else None
        limits: list[dict[str, Any]] = []
        full, _ = shrink.load_weightless(config, model_dir, model_file, limits)
        for limit in limits:
            self.emit({"event": "harness", **limit})
        shrink.cast_floats(full, request.get("dtype"))
        full_sig = shrink.signature(full, self.backend)
        self.discovery_error = full_sig["discovery_error"]
        del full
        shrunk, shrunk_config = self._shrink(config, model_dir, model_file, full_sig)
        if shrunk is None:
            return False
        weights = weight_summary(shrunk)

        self._enter("startup")
        runner = self._start_runner(shrunk, shrunk_config, model_dir, trust)
        layout = runner._cache_layout
        heads = self._attention_heads(runner)

        options = self._schedules(layout)
        longest = max(options[0].tokens().values())
        table = self.backend.model_runner.ReqToTokenPool(size=3, max_context_len=longest + 8)
        runner.init_cache_pools(table)
        self._emit_pool(runner)
        self._enter("prefill")  # the runner builds a request's cache list when the request arrives
        self._emit_layout(runner, runner._new_native_cache())
        schedule = self._choose_schedule(runner, options, weights, layout, heads)
        if schedule is None:
            self.emit({"event": "refused", "reason": "budget", "stage": "prefill",
                       "message": "even the shortest schedule would not fit the dry run's bounds (time, memory, "
                                  "the engine's pool slots)"})
            return False
        self._drive(runner, schedule, table, shrink.vocab_size(shrunk_config))
        mx.clear_cache()
        return True

    def _shrink(self, config, model_dir, model_file, full_sig):
        """The first shrunk copy whose signature proves it is the same model to the engine: with fewer
        heads (compact.py) when that holds, else with the full head count; each cut to its first
        layers of every kind where that is proven too (`_cut`)."""
        first_diff: list[str] = []
        self.copy = None
        factor = compact.head_factor(config) if self.fewer_heads else 1
        candidates = [(f"{label}, 1/{factor} of the heads", compact.fewer_heads(candidate, factor), factor)
                      for label, candidate in shrink.shrink_candidates(config)] if factor > 1 else []
        if factor > 1:  # last: the full hidden size shrunk in step with the heads
            sized = compact.head_sized_hidden(candidates[-1][1])
            if sized is not None:
                candidates.append((f"hidden size of the heads, 1/{factor} of the heads", sized, factor))
        candidates += [(label, candidate, 1) for label, candidate in shrink.shrink_candidates(config)]
        bound = self._budget_bytes()
        keep = compact.layer_period(full_sig)  # the layers a cut copy keeps
        heavy: tuple[str, int] | None = None  # the first copy that keeps every layer kind but is past the bound
        for label, candidate, scale in candidates:
            try:
                model, loaded = shrink.load_weightless(candidate, model_dir, model_file)
            except Exception as exc:  # noqa: BLE001 - the full-size config loaded: the shrink broke it
                if scale > 1:  # a fewer-heads copy the family refuses: the full-head candidates follow
                    continue
                first_diff = first_diff or [f"the {label} copy does not build: {type(exc).__name__}: {exc}"]
                self.emit({"event": "harness", "stage": "load", "step": f"shrink ({label})",
                           "class": type(exc).__name__, "message": str(exc)})
                continue
            shrink.cast_floats(model, self.request.get("dtype"))
            diff = self._differences(full_sig, shrink.signature(model, self.backend), scale)
            if diff:
                if scale == 1:  # a fewer-heads copy that differs says less than the full-head ones will
                    first_diff = first_diff or diff
                continue
            layers = {"kept": full_sig["num_layers"], "of": full_sig["num_layers"]}
            cut = self._cut(candidate, model, compact.first_layers(full_sig, keep), scale, model_dir, model_file)
            if cut is not None:
                model, loaded, candidate, layers["kept"] = cut
                label += f", the first {layers['kept']} of {layers['of']} layers"
            size = weight_summary(model)["weight_bytes"]
            if size > bound:  # its random weights alone would be past the bound: never filled
                heavy = heavy or (label, size)
                continue
            self.scaled_heads = scale > 1
            self.copy = label if scale > 1 or cut is not None else None
            shrink.randomize(model, SEED)
            self.emit({"event": "shrink", "candidate": label, "signature": full_sig, "layers": layers,
                       "changes": _changes(config, candidate)})
            return model, loaded
        if heavy is not None:
            label, size = heavy
            self.emit({"event": "refused", "reason": "budget", "stage": "load", "weight_bytes": size,
                       "budget_bytes": bound,
                       "message": f"the smallest copy that keeps every layer as the engine sees it ({label}) "
                                  f"would hold {size / 2**30:.1f} GiB of weights, past the dry run's "
                                  f"{bound / 2**30:.1f} GiB memory bound"})
            return None, None
        self.emit({"event": "refused", "reason": "shrink", "stage": "load", "diff": first_diff,
                   "message": "no shrunk copy keeps the engine's view of every layer"})
        return None, None

    @staticmethod
    def _differences(expected: dict[str, Any], small_sig: dict[str, Any], scale: int) -> list[str]:
        """How a copy's signature differs from the one it must show; empty when it proves the copy."""
        if scale > 1:
            return [] if compact.matches_scaled(expected, small_sig, scale) else [f"1/{scale} of the heads"]
        return shrink.signature_diff(expected, small_sig)

    def _cut(self, candidate, uncut, expected, scale, model_dir, model_file):
        """The proven copy `uncut` cut to the layers of `expected`, the full model's signature of its
        first layers that show every kind of layer twice (compact.layer_period): (model, loaded config,
        config, layers kept), or None where nothing is cut or the cut is not proven. Proven means its
        signature is `expected` and every layer it keeps is set up as in `uncut` (shrink.layer_states):
        no layer of the copy depends on the layers that were cut."""
        keep = expected["num_layers"]
        config = compact.fewer_layers(candidate, keep)
        if config is None:
            return None
        try:
            model, loaded = shrink.load_weightless(config, model_dir, model_file)
        except Exception:  # noqa: BLE001 - the family wants all its layers: the uncut copy serves
            return None
        shrink.cast_floats(model, self.request.get("dtype"))
        if self._differences(expected, shrink.signature(model, self.backend), scale) \
                or shrink.layer_states(shrink.decoder_layers(model, self.backend)) != \
                shrink.layer_states(shrink.decoder_layers(uncut, self.backend)[:keep]):
            return None
        return model, loaded, config, keep

    def _start_runner(self, model, config, model_dir, trust):
        """Construct the engine's runner with the server's defaults; only mlx-lm's load is swapped."""
        module = self.backend.model_runner
        deploy = self.request.get("deploy", {})

        def hand_over_shrunk_model(path, tokenizer_config=None, return_config=False, **_):
            return (model, None, config) if return_config else (model, None)

        module.mlx_lm_load = hand_over_shrunk_model
        kwargs = {"model_path": str(model_dir), "trust_remote_code": trust,
                  "disable_radix_cache": not deploy.get("radix_cache", True)}
        if deploy.get("pool_size") is not None:
            kwargs["pool_size"] = int(deploy["pool_size"])
        return module.MlxModelRunner(**kwargs)

    def _attention_heads(self, runner) -> dict[int, tuple[int, int, int]]:
        contract = self.backend.contract
        heads = {}
        for layer in runner._cache_layout.attention_layer_indices:
            attn = runner._attention_module_for_layer(layer)
            n_kv = contract.get_num_kv_heads(attn)
            heads[layer] = (contract.get_num_heads(attn), n_kv, contract.get_head_dim(attn))
        return heads

    def _emit_layout(self, runner, caches: list[Any], when: str = "startup") -> None:
        layout = runner._cache_layout
        rows = []
        for index in range(layout.num_layers):
            attr = layout.attention_attrs[index]
            rows.append({"index": index, "attention_attr": attr,
                         "engine_window": layout.window_size(index) if attr is not None else None,
                         "cache": type(caches[index]).__name__ if caches[index] is not None else None})
        self.emit({"event": "layout", "when": when, "layers": rows,
                   "full_attention_layers": list(layout.full_attention_layer_indices),
                   "sliding_attention_layers": list(layout.swa_attention_layer_indices),
                   "auxiliary_layers": list(layout.auxiliary_layer_indices),
                   "pool_size": runner.pool_size,
                   "aot_kernels": list(getattr(runner._aot_kernels, "selected_kernel_names", ()))})

    def _emit_pool(self, runner) -> None:
        pool = runner._attention_kv_pool
        info = None if pool is None else {"buffers": len(pool.k_buffer),
                                          "buffer_shape": list(pool.k_buffer[0].shape) if pool.k_buffer else None,
                                          "dtype": str(pool.k_buffer[0].dtype).removeprefix("mlx.core.")
                                          if pool.k_buffer else None}
        self.emit({"event": "pool", "pool": info})

    def _schedules(self, layout) -> list[Schedule]:
        """Candidate schedules, most thorough first: cross the engine's window, else nominal chunks."""
        windows = sorted({w for w in layout.layer_window_sizes.values() if w is not None})
        max_chunk = int(self.request.get("deploy", {}).get("chunked_prefill_size") or 8192)
        crossing = [make_schedule(windows[-1], True, max_chunk)] if windows else []
        return crossing + [make_schedule(NOMINAL_UNIT, not windows, max_chunk),
                           make_schedule(MINIMAL_UNIT, not windows, max_chunk, decode_steps=2)]

    def _budget_bytes(self) -> int:
        return int(self.request.get("budget_bytes") or DEFAULT_BUDGET_BYTES)

    def _choose_schedule(self, runner, options, weights, layout, heads) -> Schedule | None:
        """The first schedule whose estimate fits the time and memory budget and the engine's pool."""
        windows = sorted({w for w in layout.layer_window_sizes.values() if w is not None})
        budget_s = float(self.request.get("budget_seconds") or DEFAULT_BUDGET_SECONDS)
        budget_bytes = self._budget_bytes()
        pool_slots = runner.pool_size if runner._attention_kv_pool is not None else None
        dtype_bytes = _kv_dtype_bytes(runner)
        for schedule in options:
            cost = estimate(schedule, weights, layout, heads, dtype_bytes)
            slots = sum(schedule.tokens().values())
            fits = (cost["seconds"] <= budget_s and cost["peak_bytes"] <= budget_bytes
                    and (pool_slots is None or slots <= pool_slots))
            self.emit({"event": "schedule", "unit": schedule.unit, "crosses_windows": schedule.crosses,
                       "windows": windows, "estimated_seconds": round(cost.pop("seconds"), 2), **cost,
                       "pool_slots_needed": slots, "pool_slots": pool_slots,
                       "budget_seconds": budget_s, "budget_bytes": budget_bytes, "chosen": fits,
                       "steps": [[s.call, s.requests, s.lengths] for s in schedule.steps]})
            if fits:
                return schedule
        return None

    def _drive(self, runner, schedule: Schedule, table, vocab: int) -> None:
        import numpy as np

        rng = np.random.default_rng(SEED)
        recorder = self.recorder = AttentionRecorder(self.emit)
        rows = {req: i + 1 for i, req in enumerate(sorted(schedule.tokens()))}
        length: dict[str, int] = {}
        tokens: dict[str, list[int]] = {}
        next_slot = 1
        layout_sent = False
        wrapper = self.backend.kv_cache.MLXAttentionWrapper
        with recorder.installed(wrapper):
            for number, step in enumerate(schedule.steps):
                self._enter(step.stage)
                slots = {}
                for req, n in zip(step.requests, step.lengths):
                    slots[req] = list(range(next_slot, next_slot + n))
                    next_slot += n
                    start = length.get(req, 0)
                    table.req_to_token[rows[req], start:start + n] = _torch_ints(slots[req])
                step_started = time.monotonic()
                recorder.feed(step.stage, [(length.get(r, 0), n) for r, n in zip(step.requests, step.lengths)],
                              number)
                if step.call == "decode_batch":
                    runner.decode_batch(step.requests)
                    for req in step.requests:
                        length[req] += 1
                else:
                    req, n = step.requests[0], step.lengths[0]
                    new = rng.integers(0, vocab, size=n).tolist()
                    tokens[req] = tokens.get(req, []) + new
                    if step.call == "prefill":
                        runner.prefill(req_id=req, new_token_ids=new, full_token_ids=list(tokens[req]),
                                       prefix_slot_ids=[], new_slot_ids=slots[req], req_pool_idx=rows[req],
                                       needs_logits=step.needs_logits)
                    else:
                        runner.extend(req, new, slots[req], needs_logits=step.needs_logits)
                    length[req] = length.get(req, 0) + n
                    if not layout_sent:
                        self._emit_layout(runner, runner._req_caches[req], when="after first prefill")
                        layout_sent = True
                self.emit({"event": "step", "number": number, "call": step.call, "requests": step.requests,
                           "lengths": step.lengths, "seconds": round(time.monotonic() - step_started, 2),
                           "offsets": {r: _first_attention_offset(runner, r) for r in step.requests}})
            for req in sorted(length):
                runner.release_request_row(req, length[req])
                runner.remove_request(req)
        self.emit({"event": "finished", "attention_calls": recorder.calls, "lengths": length})


@contextmanager
def float32_gather_mm() -> Iterator[None]:
    """MLX's CPU gather_mm raises "[GatherMM::eval] Currently only supports float32." at eval time for
    half-precision inputs; run it in float32 and hand back the dtype Metal would have produced."""
    import mlx.core as mx

    original = mx.gather_mm

    def gather_mm(a, b, *args, **kwargs):
        dtype = a.dtype if a.dtype == b.dtype else mx.float32 if mx.float32 in (a.dtype, b.dtype) else a.dtype
        if dtype == mx.float32:
            return original(a, b, *args, **kwargs)
        return original(a.astype(mx.float32), b.astype(mx.float32), *args, **kwargs).astype(dtype)

    mx.gather_mm = gather_mm
    try:
        yield
    finally:
        mx.gather_mm = original


def _first_attention_offset(runner, req: str) -> int | None:
    caches = runner._req_caches.get(req)
    return None if caches is None else int(runner._first_attention_cache(caches).offset)


def _torch_ints(values: list[int]):
    import torch

    return torch.tensor(values, dtype=torch.int32)


def _kv_dtype_bytes(runner) -> int:
    try:
        return int(runner._get_attn_config()[2].size)
    except Exception:  # sizing only; the real failure, if any, is the runner's own
        return 4


def _changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list]:
    changes = {}
    for old, new in zip(shrink.text_sections(before), shrink.text_sections(after)):
        for key in sorted(new):
            if key != "text_config" and old.get(key) != new.get(key):
                was, now = old.get(key), new[key]
                if isinstance(was, list) and isinstance(now, list):  # a per-layer list, cut with the layers
                    was, now = f"{len(was)} entries", f"the first {len(now)}"
                changes[key] = [was, now]
    return changes


def apply_environment(deploy: dict[str, Any]) -> None:
    """Set the engine environment variables the deploy settings stand for (in the child only)."""
    # The engine leaves the cache uncapped by default; freed cache buffers would then pile up (each
    # step copies the contiguous caches), so the dry run keeps at most 0.25 GB of them for reuse.
    os.environ.setdefault("SGLANG_MLX_CACHE_LIMIT_GB", "0.25")
    if deploy.get("use_custom_rope"):
        os.environ["SGLANG_MLX_USE_CUSTOM_ROPE"] = "1"
