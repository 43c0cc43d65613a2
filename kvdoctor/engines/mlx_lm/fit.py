"""mlx-lm's start-up arithmetic on one Apple-silicon machine: the weights as stored, and what Metal's wired
limit leaves for the caches, through `mlx_lm.budget` (each request holds its own caches; no pool).

mlx-lm loads the whole model on one device (no tensor parallelism in `mlx_lm.server`) and, while it
generates, raises the wired limit to Metal's recommended working set (mlx_lm/generate.py, `wired_limit`).
That working set is macOS's, not mlx-lm's (`budget.fit.metal_working_set`: the machine's own figure where
one was seen, else about three quarters of the unified memory), which kvdoctor takes as the usable memory.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.engines.budget.common import EngineRefusal
from kvdoctor.engines.budget.facts import ModelFacts
from kvdoctor.engines.budget.fit import FitRow, Gpu, Request, Term, metal_working_set
from kvdoctor.engines.budget.weights import COMMON_RULES, Parallel, ShardRules, weights_per_rank
from kvdoctor.engines.mlx_lm import budget as mb
from kvdoctor.engines.pins import PINS
from kvdoctor.model import ModelSpec

VERSION = PINS["mlx-lm"]
RULES = ShardRules(rules=COMMON_RULES, vocab_padding=1, source=f"mlx-lm {VERSION}: one device, tensors as stored")
OUT_OF_MEMORY = "[METAL] Command buffer execution failed: Insufficient Memory"


def fit(spec: ModelSpec, facts: ModelFacts, gpu: Gpu, layout: dict[str, Any], request: Request,
        settings: dict[str, Any] | None = None) -> FitRow:
    s = settings or {}
    assert spec.checkpoint is not None
    weights = weights_per_rank(spec.checkpoint, spec.config, RULES, Parallel(), spec.num_hidden_layers)
    wired, wired_source = metal_working_set(gpu, s)
    kv = wired - weights.bytes_per_rank if s.get("kv_budget") is None else int(s["kv_budget"])
    terms = [Term(name="reserved", bytes=gpu.memory_bytes - wired, source="outside Metal's recommended working set "
                  f"(mlx_lm/generate.py wired_limit): {wired_source}"),
             Term(name="weights", bytes=weights.bytes_per_rank, source="exact: the safetensors headers, as stored"),
             Term(name="kv", bytes=max(kv, 0), source="what the weights leave of the working set")]
    context = request.context or facts.max_position or 0
    row = FitRow(engine="mlx-lm", version=VERSION, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, gpus=1,
                 layout={"tp": 1}, weights=weights, terms=terms, kv_bytes=kv, context=context)
    if not gpu.unified:
        row.notes.append(f"{gpu.name} is not Apple silicon: mlx-lm runs on Metal")
    if weights.bytes_per_rank > 0.9 * wired:
        row.notes.append("mlx-lm warns that the model is close to the maximum recommended size and may be slow")
    if kv <= 0:
        row.refusal = EngineRefusal("RuntimeError", OUT_OF_MEMORY, stage="prefill")
        return row
    mode = mb.Mode(context=context, kv_budget_bytes=kv, max_kv_size=s.get("max_kv_size"), kv_bits=s.get("kv_bits"))
    budget = mb.plan(facts, mode, spec.config)
    row.max_context = mb.max_context_fit(facts, spec.config, mb.Mode(context=max(context, facts.max_position or 0),
                                                                     kv_budget_bytes=kv), budget)
    if budget.error is not None:
        row.refusal = budget.error
        return row
    concurrency = budget.capacity.max_concurrency
    row.max_concurrency = float(concurrency) if isinstance(concurrency, (int, float)) else None
    row.fits = (row.max_concurrency or 0) >= (request.concurrency or 1)
    if not row.fits and row.max_concurrency is not None and row.max_concurrency < 1:
        row.refusal = EngineRefusal("RuntimeError", OUT_OF_MEMORY, stage="prefill")
    row.launch = ["mlx_lm.server", "--model", spec.hf_id or str(spec.model_dir)]
    return row


def layouts(facts: ModelFacts, config: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    """mlx-lm serves a model on one device: one layout of one GPU, none of more."""
    return [{"tp": 1}] if gpus == 1 else []
