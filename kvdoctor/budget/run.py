"""One budget run: the modes of each engine, the memory each gets, and the JSON document.

The memory left for KV caches after weights is profiled on the GPU by the engines themselves, so
it is an input (`kv_budget`). Given a GPU size instead, kvdoctor estimates it from the weight
bytes in the checkpoint headers and labels the result an estimate.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from kvdoctor.engines.mlx_lm import budget as mlxlm
from kvdoctor.engines.sglang_cuda import budget as sglang
from kvdoctor.engines.vllm import budget as vllm
from kvdoctor.budget.common import Budget, EngineRefusal, GiB
from kvdoctor.budget.facts import ModelFacts
from kvdoctor.budget.settings import BudgetSettings, parse_size
from kvdoctor.errors import InputError
from kvdoctor.model import ModelSpec

if TYPE_CHECKING:
    from kvdoctor.engines.mlx_lm.profile import MlxLmSettings
    from kvdoctor.engines.sglang import SglangSettings
    from kvdoctor.engines.vllm.settings import VllmSettings

VLLM_GPU_UTILIZATION = 0.92  # config/cache.py:215 default in 0.33.0
SGLANG_MIN_RESERVE = 10 * GiB  # arg_groups/memory_hook.py: reserve floor on GPUs over 60 GiB


def default_context(facts: ModelFacts, settings: BudgetSettings) -> int:
    if settings.context:
        return settings.context
    if isinstance(facts.max_position, int) and facts.max_position > 0:
        return facts.max_position
    raise InputError(f"{facts.name}: config.json names no maximum context (max_position_embeddings, "
                     "model_max_length, ...); give --context")


def kv_memory(engine: str, facts: ModelFacts, settings: BudgetSettings, tp: int = 1,
              chunked_prefill_size: int = 0) -> tuple[int, dict[str, Any]]:
    """(bytes for KV and state on one rank, how that figure was obtained)."""
    if settings.kv_budget is not None:
        size = parse_size(settings.kv_budget, "kv budget")
        return size, {"source": "user", "kv_budget_bytes": size}
    if settings.gpu_memory is None:
        raise InputError("give the memory left for KV caches (--kv-budget 40GiB, or budget.kv_budget in the "
                         "deploy file) or a GPU size to estimate it from (--gpu-memory 141GiB)")
    gpu = parse_size(settings.gpu_memory, "gpu memory")
    if not facts.weights_bytes:
        raise InputError(f"{facts.name}: --gpu-memory needs the checkpoint's safetensors headers to count the "
                         "weights, and this model directory has none; give --kv-budget instead")
    weights = facts.weights_bytes // tp
    if engine == "vllm":
        size = int(gpu * VLLM_GPU_UTILIZATION) - weights
        how = (f"GPU {gpu} B x gpu_memory_utilization {VLLM_GPU_UTILIZATION} - weights {weights} B per rank; "
               "the activation peak vLLM profiles is not subtracted")
    elif engine == "sglang":
        reserve = max(SGLANG_MIN_RESERVE, (512 + int(1.5 * max(chunked_prefill_size, 2048))) << 20)
        size = gpu - reserve - weights
        how = f"GPU {gpu} B - reserved {reserve} B (mem_fraction_static) - weights {weights} B per rank"
    else:
        size = gpu - weights
        how = f"unified memory {gpu} B - weights {weights} B"
    if size <= 0:
        raise InputError(f"{facts.name}: the weights ({weights} B per rank) leave no memory for KV caches on a "
                         f"{gpu} B GPU under {engine}'s reservation")
    return size, {"source": "estimated", "kv_budget_bytes": size, "gpu_memory_bytes": gpu,
                  "weights_bytes": weights, "how": how}


def vllm_modes(facts: ModelFacts, s: VllmSettings, context: int, memory: int, all_modes: bool,
               hma: bool = True) -> list[vllm.Mode]:
    """The modes of the `vllm:` section (vLLM's names; unset knobs at vLLM's defaults). `hma` is the
    profile's decision (the deploy flag, or vLLM's own choice when unset)."""
    base = vllm.Mode(max_model_len=context, kv_budget_bytes=memory, kv_cache_dtype=s.kv_cache_dtype,
                     tp=s.tensor_parallel_size, hma=hma, prefix_caching=s.enable_prefix_caching is not False,
                     num_speculative_tokens=s.num_speculative_tokens, async_scheduling=s.async_scheduling,
                     block_size=s.block_size)
    given: dict[str, Any] = {k: v for k, v in (("max_num_batched_tokens", s.max_num_batched_tokens),
                               ("max_num_seqs", s.max_num_seqs)) if v is not None}
    base = replace(base, **given)
    if not all_modes:
        return [base]
    modes = [base, replace(base, hma=not base.hma)]
    if base.kv_cache_dtype == "auto":
        modes.append(replace(base, kv_cache_dtype="fp8"))
    if facts.state_kind:
        modes.append(replace(base, prefix_caching=not base.prefix_caching))
    if facts.windows:
        modes.append(replace(base, max_num_batched_tokens=2048, async_scheduling=False))
    return modes


def sglang_modes(facts: ModelFacts, s: SglangSettings, context: int, memory: int,
                 all_modes: bool) -> list[sglang.Mode]:
    base = sglang.Mode(context_length=context, kv_budget_bytes=memory, page_size=s.page_size,
                       swa_full_tokens_ratio=s.swa_full_tokens_ratio,
                       disable_hybrid_swa_memory=s.disable_hybrid_swa_memory, kv_cache_dtype=s.kv_cache_dtype,
                       tp=s.tp_size or 1, max_mamba_cache_size=s.max_mamba_cache_size,
                       mamba_full_memory_ratio=s.mamba_full_memory_ratio, mamba_ssm_dtype=s.mamba_ssm_dtype,
                       radix_cache=s.radix_cache, max_running_requests=s.max_running_requests,
                       max_total_tokens=s.max_total_tokens, chunked_prefill_size=s.chunked_prefill_size)
    if not all_modes:
        return [base]
    modes = [base]
    if sglang.hybrid_swa(facts, base) and facts.windows:
        modes += [replace(base, swa_full_tokens_ratio=r) for r in (0.5, 0.2) if r != base.swa_full_tokens_ratio]
        modes.append(replace(base, disable_hybrid_swa_memory=True))
    if facts.state_kind:
        other = "bfloat16" if sglang.ssm_dtype(facts, base) == "float32" else "float32"
        modes += [replace(base, mamba_ssm_dtype=other), replace(base, radix_cache=not base.radix_cache)]
    if base.kv_cache_dtype == "auto":
        modes.append(replace(base, kv_cache_dtype="fp8_e4m3"))
    return modes


def mlx_modes(facts: ModelFacts, s: MlxLmSettings, context: int, memory: int, all_modes: bool) -> list[mlxlm.Mode]:
    base = mlxlm.Mode(context=context, kv_budget_bytes=memory, max_kv_size=s.max_kv_size, kv_bits=s.kv_bits,
                      kv_group_size=s.kv_group_size, quantized_kv_start=s.quantized_kv_start,
                      prefill_step_size=s.prefill_step_size)
    if not all_modes:
        return [base]
    modes = [base]
    for bits in (8, 4):
        if bits != base.kv_bits:
            modes.append(replace(base, kv_bits=bits))
    if base.max_kv_size is None:
        modes.append(replace(base, max_kv_size=min(4096, context)))
    return modes


# Each engine profile's budget() delegates here: the memory, the modes, one Budget per mode.

def vllm_budgets(facts: ModelFacts, s: VllmSettings, inputs: BudgetSettings,
                 all_modes: bool, hma: bool = True) -> tuple[list[Budget], dict[str, Any]]:
    """The `vllm:` section's max_model_len and kv_budget stand in for budget.context / budget.kv_budget
    when those are not given."""
    if inputs.kv_budget is None and s.kv_budget is not None:
        inputs = inputs.model_copy(update={"kv_budget": s.kv_budget})
    memory, how = kv_memory("vllm", facts, inputs, tp=s.tensor_parallel_size)
    context = inputs.context or s.max_model_len or default_context(facts, inputs)
    budgets = [vllm.plan(facts, m) for m in vllm_modes(facts, s, context, memory, all_modes, hma)]
    return _with_memory(budgets, memory), how


def sglang_budgets(facts: ModelFacts, s: SglangSettings, inputs: BudgetSettings,
                   all_modes: bool) -> tuple[list[Budget], dict[str, Any]]:
    memory, how = kv_memory("sglang", facts, inputs, tp=s.tp_size or 1, chunked_prefill_size=s.chunked_prefill_size)
    context = default_context(facts, inputs)
    budgets = _with_memory([sglang.plan(facts, m) for m in sglang_modes(facts, s, context, memory, all_modes)],
                           memory)
    for b in budgets:
        if b.error is None:
            b.capacity["max_context_fit"] = b.capacity["max_total_num_tokens"]
    return budgets, how


def mlx_budgets(facts: ModelFacts, config: dict[str, Any], s: MlxLmSettings, inputs: BudgetSettings,
                all_modes: bool) -> tuple[list[Budget], dict[str, Any]]:
    memory, how = kv_memory("mlx-lm", facts, inputs)
    context = default_context(facts, inputs)
    modes = mlx_modes(facts, s, context, memory, all_modes)
    budgets = [mlxlm.plan(facts, m, config) for m in modes]
    for m, b in zip(modes, budgets):
        b.capacity["max_context_fit"] = mlx_max_context(facts, config, m, b)
    return _with_memory(budgets, memory), how


def _with_memory(budgets: list[Budget], memory: int) -> list[Budget]:
    for b in budgets:
        b.capacity.setdefault("kv_budget_bytes", memory)
    return budgets


def plan_engine(engine: str, facts: ModelFacts, config: dict[str, Any], inputs: BudgetSettings, settings: BaseModel,
                all_modes: bool) -> tuple[list[Budget], dict[str, Any]]:
    """One engine's budgets: its profile's model, with its deploy section."""
    from kvdoctor.engines import profile

    return profile(engine).budget(facts, config, settings, inputs, all_modes)


def mlx_max_context(facts: ModelFacts, config: dict, mode: mlxlm.Mode, budget: Budget) -> int | None:
    """The longest prompt, up to the requested context, whose caches fit the budget at their
    prefill peak (as vLLM searches up to max_model_len); None when the mode fails."""
    if budget.error is not None:
        return None
    kinds, _ = mlxlm.layer_caches(facts, mode, config)

    def fits(t: int) -> bool:
        try:
            return mlxlm.simulate(facts, replace(mode, context=t), kinds)["peak_bytes"] <= mode.kv_budget_bytes
        except EngineRefusal:
            return False

    if not fits(1):
        return 0
    hi = mode.context
    if fits(hi):
        return hi
    lo = 1
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def document(spec: ModelSpec, facts: ModelFacts, results: dict[str, tuple[list[Budget], dict]],
             settings: BudgetSettings, findings: dict[str, list[list[dict]]]) -> dict[str, Any]:
    raw = (spec.model_dir / "config.json").read_bytes()
    kinds = dict(facts.kinds())
    engines = []
    for engine, (budgets, how) in results.items():
        for i, b in enumerate(budgets):
            row = b.to_json()
            row["budget"] = how
            row["findings"] = findings.get(engine, [[]] * len(budgets))[i]
            engines.append(row)
    return {
        "schema": "kvdoctor.budget/1",
        "model": {"id": facts.name, "target": spec.target, "model_type": facts.model_type,
                  "config_sha256": hashlib.sha256(raw).hexdigest(), "layers": len(facts.layers),
                  "layer_kinds": kinds, "windows": sorted(facts.windows),
                  "weights_bytes": facts.weights_bytes},
        "inputs": {"context": default_context(facts, settings), "kv_budget": settings.kv_budget,
                   "gpu_memory": settings.gpu_memory},
        "engines": engines,
    }
