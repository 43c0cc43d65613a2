"""sglang's MLX backend at start-up on one Apple-silicon machine: the weights mlx-lm loads, the slots its
runner auto-sizes for the shared attention KV pool, and what they serve. File:line references are to the
sglang 0.5.23 wheel (srt/hardware_backend/mlx/).

    working set   = Metal's recommended working set (model_runner.py:221-225 wires it; `metal_working_set`)
    fraction      = --mem-fraction-static, else sglang's default for that memory on a non-CUDA platform:
                    torch.mps.recommended_max_memory() (the same working set) in MiB through the server
                    arguments' formula (`sglang.reserve.defaults`, prefill graphs off: `cuda=False`)
    KV budget     = min(working set x fraction - MLX memory in use (the weights, evaluated before sizing),
                        memory macOS reports available x fraction)                     model_runner.py:669-702
    slot          = 2 x pool layers x n_kv_heads x head_dim x KV dtype bytes, pool layers being the
                    full-attention layers (every attention layer when none is full)
    pool size     = --max-total-tokens, else max(KV budget // slot, 256)
    requests      = min(--max-running-requests or 4096, pool size // 2)   model_runner_stub.py:195-250

The pool (pool size + 1 slots, slot 0 padding) is allocated only with the radix cache on and no
sliding-window layer (model_runner.py:722-760); otherwise the pool size is the scheduler's token budget alone
and every request holds mlx-lm's own caches. What macOS reports available is the state of the machine at
start-up, which no config tells: the row says how much other processes may hold before it binds.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.engines.budget.common import EngineRefusal, MiB
from kvdoctor.engines.budget.facts import ModelFacts, dtype_bytes
from kvdoctor.engines.budget.fit import FitRow, Gpu, Request, Term, metal_working_set
from kvdoctor.engines.budget.weights import Parallel, weights_per_rank
from kvdoctor.engines.mlx_lm.fit import RULES
from kvdoctor.engines.pins import PINS
from kvdoctor.engines.sglang import reserve
from kvdoctor.errors import InputError
from kvdoctor.model import ModelSpec

VERSION = PINS["sglang"]
MIN_POOL = 256  # the auto-sized pool's floor (model_runner.py:693)
MAX_REQUESTS = 4096  # the running-request cap without --max-running-requests (model_runner_stub.py:215)
SOURCE = f"sglang {VERSION} srt/hardware_backend/mlx/"


def fit(spec: ModelSpec, facts: ModelFacts, gpu: Gpu, plan: Any, request: Request, settings: dict[str, Any]) -> FitRow:
    """One machine, the layout `plan` (a sglang-mlx Plan) predicts, and the request."""
    s = settings
    assert spec.checkpoint is not None
    weights = weights_per_rank(spec.checkpoint, spec.config, RULES, Parallel(), spec.num_hidden_layers)
    wired, wired_source = metal_working_set(gpu, s)
    if s.get("mem_fraction_static"):
        mfs, how = float(s["mem_fraction_static"]), "--mem-fraction-static"
    else:
        d = reserve.defaults(wired // MiB, tp=1, release=VERSION, chunked=s.get("chunked_prefill_size"),
                             max_running=s.get("max_running_requests"), cuda=False, config=spec.raw_config)
        mfs, how = d.mem_fraction_static, (f"sglang's default for {wired // MiB} MiB of working set: "
                                           f"{d.reserved_mib:.0f} MiB held back, {d.source}")
    usable = int(wired * mfs)
    budget = kv_budget(wired, weights.bytes_per_rank, mfs)
    context = request.context or s.get("context_length") or facts.max_position or 0
    if not context:
        raise InputError(f"{facts.name}: the config states no context length (max_position_embeddings); give --context")
    row = FitRow(engine="sglang-mlx", version=VERSION, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, gpus=1,
                 layout={"tp": 1}, weights=weights, terms=[], kv_bytes=budget, context=context)
    if not gpu.unified:
        row.notes.append(f"{gpu.name} is not Apple silicon: sglang's MLX backend runs on Metal")
    if plan.refusals:
        first = plan.refusals[0]
        row.refusal = EngineRefusal(first.error_class, first.message, stage=first.stage)
        if first.stage in ("load", "startup"):  # the runner stops before (or while) it sizes the pool
            row.terms = _terms(gpu, usable, mfs, how, wired_source, weights.bytes_per_rank, [])
            return row
    slot, pool_layers, note = slot_bytes(plan, facts)
    if note:
        row.notes.append(note)
    pool = int(s["pool_size"]) if s.get("pool_size") else auto_pool(slot, budget)
    allocated = (pool + 1) * slot if plan.facts.stock_pool else 0  # the plan's: radix cache on, no sliding layer
    kv = Term(name="kv", bytes=allocated or budget, source=(
        f"the shared pool, {pool} slots + 1 of {slot} B ({pool_layers} layers): model_runner.py:722-760"
        if allocated else "the token budget the pool size stands for; no shared pool is allocated "
        "(a sliding-window layer, or the radix cache off): each request holds mlx-lm's own caches"))
    row.terms = _terms(gpu, usable, mfs, how, wired_source, weights.bytes_per_rank, [kv])
    row.kv_tokens = pool
    row.notes.append(f"the KV budget is also at most {mfs} x the memory macOS reports available at start-up "
                     f"(model_runner.py:687-691): it binds only if other processes hold more than "
                     f"{_other_processes(gpu, weights.bytes_per_rank, budget, mfs) / (1 << 30):.2f} GiB")
    if weights.bytes_per_rank >= usable and not s.get("pool_size"):
        row.notes.append(f"the weights leave none of the working set's {mfs} share: the pool takes its floor of "
                         f"{MIN_POOL} slots, and the machine pages once requests grow")
    if row.refusal is not None:
        return row
    requested = s.get("max_running_requests")
    running = min(int(requested or MAX_REQUESTS), pool // 2)
    if running <= 0:
        row.refusal = EngineRefusal("RuntimeError", "max_running_requests resolves to 0: the pool's "
                                    f"{pool} tokens back no request", stage="startup")
        return row
    extra = _unpooled_per_request(plan, facts)
    if extra:
        row.notes.append(f"each running request also holds about {extra / (1 << 20):.1f} MiB of caches outside the "
                         f"token budget (sliding windows and recurrent state, in mlx-lm's own caches): "
                         f"{running} requests, {running * extra / (1 << 30):.2f} GiB")
    row.max_context = min(pool, facts.max_position or pool)
    row.max_concurrency = float(min(running, pool / context))
    if context > pool:
        row.refusal = EngineRefusal("ValueError", f"context_length ({context}) exceeds the {pool} tokens of the KV "
                                    "pool: no request of that length can be scheduled", stage="prefill")
        return row
    row.fits = row.max_concurrency >= (request.concurrency or 1)
    row.launch = launch(spec, context, mfs, s)
    row.deploy = {"context_length": context, "mem_fraction_static": mfs,
                  **{k: s[k] for k in ("pool_size", "max_running_requests", "working_set") if s.get(k)}}
    return row


def _terms(gpu: Gpu, usable: int, mfs: float, how: str, wired_source: str, weights: int, kv: list[Term]) -> list[Term]:
    held = weights + sum(t.bytes for t in kv)
    return [Term(name="reserved", bytes=gpu.memory_bytes - usable,
                 source=f"outside the working set x mem_fraction_static {mfs} ({how}); working set: {wired_source}"),
            Term(name="weights", bytes=weights, source="exact: the safetensors headers, as stored (mlx-lm loads them "
                 "and the runner evaluates them before sizing: model_runner.py:563-565)"),
            *kv, Term(name="free", bytes=max(usable - held, 0), source="what the rest leaves")]


def kv_budget(working_set: int, in_use: int, fraction: float, available: int | None = None) -> int:
    """The bytes the runner sizes its pool from: its share of the working set less the MLX memory in use, and
    at most its share of what macOS reports available (None: not known, taken as not binding)."""
    budget = max(int(working_set * fraction) - in_use, 0)
    return budget if available is None else min(budget, int(available * fraction))


def auto_pool(slot: int, budget: int) -> int:
    """The auto-sized pool's slots: as many as the budget holds, at least MIN_POOL."""
    return max(budget // slot, MIN_POOL) if slot else MIN_POOL


def slot_bytes(plan: Any, facts: ModelFacts) -> tuple[int, int, str]:
    """Bytes one pool slot takes, the layers it spans, and a note when the layout is the config's, not mlx-lm's."""
    mlx = plan.facts
    layout = mlx.layout
    if layout is None or not layout.attention:
        layers = [layer for layer in facts.layers if layer.kind in ("full", "sliding")]
        full = [layer for layer in layers if layer.kind == "full"] or layers
        slot = 2 * len(full) * facts.kv_heads * facts.head_dim * dtype_bytes(facts.serving_dtype)
        return slot, len(full), ("mlx-lm's model class was not read (kvdoctor's mlx extra): the pool is sized from "
                                 "the config's layers, not the object sglang reads")
    pool_layers = layout.full or layout.attention
    kv = mlx.kv.get(pool_layers[0])
    if kv is None or kv.n_kv_heads is None or kv.head_dim is None:
        return 0, len(pool_layers), ""
    return 2 * len(pool_layers) * kv.n_kv_heads * kv.head_dim * dtype_bytes(kv.dtype), len(pool_layers), ""


def _unpooled_per_request(plan: Any, facts: ModelFacts) -> int:
    """Bytes of one request's caches the token budget does not count: its sliding windows, full, and its
    recurrent state (mlx-lm's caches; the radix cache keeps up to four state slots a request)."""
    from kvdoctor.engines.mlx_lm.budget import kv_token_bytes, state_bytes

    layout = plan.facts.layout
    if layout is None:
        return 0
    per_token = kv_token_bytes(facts, "full", None, 64)
    windows = sum(layout.window(i) or 0 for i in layout.sliding) * per_token
    state = 0
    if layout.auxiliary and (facts.gdn or facts.kda):
        state = len([layer for layer in facts.layers if layer.kind in ("gdn", "kda")]) * state_bytes(facts)
    return windows + state


def _other_processes(gpu: Gpu, weights: int, budget: int, mfs: float) -> int:
    """Memory other processes may hold before `available x fraction` drops under the working-set budget."""
    return max(gpu.memory_bytes - weights - int(budget / mfs), 0)


def launch(spec: ModelSpec, context: int, mfs: float, s: dict[str, Any]) -> list[str]:
    out = ["env", "SGLANG_USE_MLX=1", "python", "-m", "sglang.launch_server", "--model-path",
           spec.hf_id or str(spec.model_dir), "--context-length", str(context), "--mem-fraction-static", str(mfs)]
    if s.get("pool_size"):
        out += ["--max-total-tokens", str(s["pool_size"])]
    if s.get("max_running_requests"):
        out += ["--max-running-requests", str(s["max_running_requests"])]
    if s.get("radix_cache") is False:
        out.append("--disable-radix-cache")
    return out
