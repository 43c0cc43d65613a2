"""MEM rules: what the KV budget of each engine and mode predicts will go wrong or waste memory.

`kvdoctor budget` attaches these findings to each engine/mode it prints; `kvdoctor check` runs
them when the deploy file has a `budget:` section, on the modes each engine's own section describes.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterable

from msgspec import UNSET

from kvdoctor.engines.budget.common import Budget, GiB, MiB
from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.engines import profile, profile_class, section_name
from kvdoctor.limits import human_bytes
from kvdoctor.model import Finding, Source

if TYPE_CHECKING:
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.deploy import Deploy
    from kvdoctor.engines.mlx_lm.budget import MlxBudget
    from kvdoctor.engines.sglang import budget as sglang
    from kvdoctor.engines.sglang.budget import SglangBudget
    from kvdoctor.engines.vllm.budget import VllmBudget

RULE = Rule(codes=tuple(f"MEM{n:03d}" for n in range(1, 15)))  # runs when the deploy sets budget:

MEMORY_REFUSALS = ("No available memory for the cache blocks", "Not enough memory.",
                   "Not enough GPU memory for hybrid", "Hybrid (mamba/linear-attention) state cache is too small",
                   "SWA pool cap (")
GEMMA_OVERRIDE_ARCHS = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")


def label(budget: Budget) -> str:
    """The engine, its release and the knobs of the mode, as a finding names them."""
    knobs = profile(budget.engine).budget_view(budget.to_json()).label
    return f"{budget.engine} {budget.version} ({', '.join(knobs)})"


def gib(value: float) -> str:
    return human_bytes(value, 2, unit="GiB")


def _error(budget: Budget) -> dict[str, Any] | None:
    return budget.error.to_json() if budget.error else None


def findings_for(facts: ModelFacts, budget: Budget, where: dict[str, Source | None]) -> list[Finding]:
    """The MEM findings of one engine in one mode. `where` maps a setting name to its Source."""
    return list(rules()[type(budget)](facts, budget, where))


@lru_cache(maxsize=1)
def rules() -> dict[type, Callable[..., Iterable[Finding]]]:
    """Each engine's MEM rules, by the type of its budget records (imported when a budget is checked)."""
    from kvdoctor.engines.mlx_lm.budget import MlxBudget
    from kvdoctor.engines.sglang.budget import SglangBudget
    from kvdoctor.engines.vllm.budget import VllmBudget

    return {VllmBudget: _vllm, SglangBudget: _sglang, MlxBudget: _mlx}


def _vllm(facts: ModelFacts, b: VllmBudget, where) -> Iterable[Finding]:
    from kvdoctor.engines.vllm import budget as vllm

    name, m, err, c, sizing = label(b), b.mode, b.error, b.capacity, b.sizing
    if err and err.message.startswith("Failed to promote local KV cache specs"):
        yield Finding.at("MEM002", f"{name}: the hybrid KV cache manager is off, and {facts.state_kind.upper()} "
                                   "state layers cannot be promoted to full attention, so the engine will not start",
                         where.get("hma"), engine_error=_error(b), evidence={"state_kind": facts.state_kind})
    elif err and err.message.startswith("To serve at least one request"):
        assert sizing is not None and sizing.needed_bytes is not None  # the admission check follows the sizing
        fit = c.max_model_len_fit
        yield Finding.at("MEM004", f"{name}: max_model_len {m.max_model_len} needs "
                                   f"{gib(sizing.needed_bytes)} of KV cache per request, more than the "
                                   f"{gib(c.kv_budget_bytes)} budget; the engine's own estimate of the longest that "
                                   f"fits is {fit}", where.get("context"), engine_error=_error(b),
                         evidence={"needed_bytes": sizing.needed_bytes, "max_model_len_fit": fit})
    elif err and err.message.startswith("Total number of attention heads"):
        yield Finding.at("MEM014", f"{name}: {err.message}", where.get("tp"), engine_error=_error(b))
    elif err and err.message.startswith(MEMORY_REFUSALS):
        yield Finding.at("MEM013", f"{name}: {err.message}", where.get("kv_budget"), engine_error=_error(b))
    alignment_log = [n for n in b.notes if n.startswith(("Setting attention block size", "Padding mamba page"))]
    if alignment_log and b.state:
        s = b.state
        padding = (f"the state page is padded by {s.padding_pct:.2f}%" if s.padded_page_bytes
                   else "the state fills the page exactly")
        yield Finding.at("MEM005", f"{name}: the attention block grows to {m.block_size} tokens so one "
                                   f"page holds a {facts.state_kind.upper()} state "
                                   f"({s.bytes_per_request_per_layer} B); {padding}", where.get("block_size"),
                         evidence={"block_size": m.block_size, "padding_pct": s.padding_pct,
                                   "engine_log": alignment_log})
    if b.groups and b.pool and b.pool.padding_bytes_per_block:
        waste = b.pool.padding_bytes_per_block / b.pool.bytes_per_block
        yield Finding.at("MEM006", f"{name}: KV cache groups are padded to equal size; "
                                   f"{b.pool.padding_bytes_per_block} of every {b.pool.bytes_per_block} bytes "
                                   f"per block ({waste:.1%}) belong to padding layers", None,
                         evidence={"padding_bytes_per_block": b.pool.padding_bytes_per_block,
                                   "engine_log": [n for n in b.notes if n.startswith("Add ")]})
    needed = sizing.needed_bytes if sizing else None
    if not m.hma and facts.windows and not facts.state_kind and b.error is None and needed:
        on = vllm.plan(facts, vllm.Mode(**{**_vllm_mode_args(b), "hma": True}))
        on_needed = on.sizing.needed_bytes if on.sizing else None
        if on.error is None and on_needed and on_needed < needed:
            ratio = needed / on_needed
            yield Finding.at("MEM003", f"{name}: with the hybrid manager off every sliding layer reserves the full "
                                       f"context: {gib(needed)} per request at "
                                       f"{m.max_model_len} tokens instead of {gib(on_needed)} "
                                       f"({ratio:.2f}x); concurrency {c.max_concurrency:.2f} instead of "
                                       f"{on.capacity.max_concurrency:.2f}", where.get("hma"),
                             evidence={"bytes_off": needed, "bytes_on": on_needed,
                                       "ratio": ratio, "engine_log": [n for n in b.notes if n.startswith("Hybrid")]})
    full_graphs = where.get("_cudagraph_full", True)
    blocks = sizing.num_blocks if sizing else None
    if facts.state_kind and b.error is None and full_graphs and blocks is not None and m.max_num_seqs > blocks:
        yield Finding.at("MEM001", f"{name}: max_num_seqs {m.max_num_seqs} exceeds the {blocks} Mamba cache "
                                   f"blocks this budget gives; CUDA graph capture fails after the weights load. "
                                   f"The largest safe max_num_seqs is {blocks}", where.get("max_num_seqs"),
                         engine_error={"class": "ValueError", "stage": "startup", "message": (
                             f"max_num_seqs ({m.max_num_seqs}) exceeds available Mamba cache blocks ({blocks}). "
                             "Each decode sequence requires one Mamba cache block, so CUDA graph capture cannot "
                             f"proceed. Please lower max_num_seqs to at most {blocks} or increase "
                             "gpu_memory_utilization.")},
                         evidence={"num_blocks": blocks, "max_num_seqs": m.max_num_seqs})


def _vllm_mode_args(b: VllmBudget) -> dict[str, Any]:
    m = b.mode
    return {"max_model_len": m.max_model_len, "kv_budget_bytes": b.capacity.kv_budget_bytes,
            "kv_cache_dtype": m.kv_cache_dtype, "tp": m.tp, "hma": m.hma, "prefix_caching": m.prefix_caching,
            "num_speculative_tokens": m.num_speculative_tokens, "max_num_batched_tokens": m.max_num_batched_tokens,
            "async_scheduling": m.async_scheduling, "max_num_seqs": m.max_num_seqs}


def _sglang(facts: ModelFacts, b: SglangBudget, where) -> Iterable[Finding]:
    from kvdoctor.engines.sglang import budget as sglang

    name, m, err, s = label(b), b.mode, b.error, b.state
    if err and err.message.startswith("SWA pool (") and "cannot hold even one request" in err.message:
        yield Finding.at("MEM007", f"{name}: the SWA pool is too small to admit a single request",
                         where.get("swa_full_tokens_ratio"), engine_error=_error(b))
    elif err and err.message.startswith(MEMORY_REFUSALS):
        yield Finding.at("MEM013", f"{name}: {err.message}", where.get("kv_budget"), engine_error=_error(b))
    capped = [n for n in b.notes if n.startswith("max_running_requests is capped")]
    if capped and b.error is None and s is not None:
        requested = m.max_running_requests
        yield Finding.at("MEM008", f"{name}: max_running_requests is silently capped to "
                                   f"{b.capacity.max_running_requests} by {s.slots} state slots "
                                   f"({s.slots_per_request} per request)"
                                   + (f"; the {requested} asked for is never reached" if requested else ""),
                         where.get("max_running_requests"),
                         evidence={"slots": s.slots, "slots_per_request": s.slots_per_request,
                                   "engine_log": capped})
    if facts.windows and not m.hybrid_swa and not m.disable_hybrid_swa_memory:
        cell = next(r.bytes_per_token_per_layer for r in b.layer_kinds)
        swa_layers = facts.count("sliding")
        log = (f"Disable hybrid SWA memory for {facts.architectures[0]} as it is not yet supported."
               if set(facts.architectures) & set(GEMMA_OVERRIDE_ARCHS) else None)
        yield Finding.at("MEM009", f"{name}: {', '.join(facts.architectures) or facts.model_type} gets no separate "
                                   f"SWA pool, so its {swa_layers} sliding layers (window {min(facts.windows)}) "
                                   f"pay full-length slots: {swa_layers * cell} of every "
                                   f"{len(facts.layers) * cell} bytes per token", where.get("disable_hybrid_swa_memory"),
                         evidence={"sliding_layers": swa_layers, "bytes_per_token": len(facts.layers) * cell,
                                   "engine_log": [log] if log else []})
    if facts.gdn and s and s.ssm_dtype == "float32" and s.slots:  # vLLM: KDA is fp32 too
        half_mode = _sg_mode(b)
        half_bytes = sglang.state_per_request(facts, half_mode)[0]
        half_slots = sglang.mamba_slots(b.capacity.kv_budget_bytes / GiB, half_bytes, half_mode)[0]
        from kvdoctor.engines.vllm.budget import SSM_DTYPE_FROM_CONFIG

        vllm_too = facts.config_ssm_dtype == "float32" and bool(SSM_DTYPE_FROM_CONFIG & set(facts.architectures))
        vllm_keeps = "float32 too (the config's mamba_ssm_dtype)" if vllm_too else "the model dtype"
        yield Finding.at("MEM010", f"{name}: SGLang keeps the SSM state in float32 "
                                   f"({s.bytes_per_slot / MiB:.1f} MiB per request) where vLLM keeps "
                                   f"{vllm_keeps}; bfloat16 would make it {half_bytes / MiB:.1f} MiB and give "
                                   f"{half_slots} state slots instead of {s.slots}",
                         where.get("mamba_ssm_dtype"),
                         evidence={"bytes_per_slot": s.bytes_per_slot, "bytes_per_slot_bf16": half_bytes,
                                   "slots": s.slots, "slots_bf16": half_slots})


def _sg_mode(b: SglangBudget) -> sglang.Mode:
    """The mode of a budget with a recurrent state, with the SSM state in bfloat16."""
    from kvdoctor.engines.sglang import budget as sglang

    m = b.mode
    assert isinstance(m.max_mamba_cache_size, (int, type(None))) and isinstance(m.mamba_full_memory_ratio, float)
    return sglang.Mode(context_length=m.context_length, kv_budget_bytes=b.capacity.kv_budget_bytes,
                       page_size=m.page_size, tp=m.tp, kv_cache_dtype=m.kv_cache_dtype,
                       max_mamba_cache_size=m.max_mamba_cache_size, mamba_full_memory_ratio=m.mamba_full_memory_ratio,
                       radix_cache=m.radix_cache, max_running_requests=m.max_running_requests,
                       mamba_ssm_dtype="bfloat16")


def _mlx(facts: ModelFacts, b: MlxBudget, where) -> Iterable[Finding]:
    name, m, err = label(b), b.mode, b.error
    if err and err.message == "RotatingKVCache Quantization NYI":
        rotating = sum(r.layers for r in b.layer_kinds if r.cache == "RotatingKVCache")
        yield Finding.at("MEM011", f"{name}: --kv-bits {m.kv_bits} with {rotating} RotatingKVCache layers: the "
                                   f"first request that reaches {m.quantized_kv_start} tokens fails",
                         where.get("kv_bits"), engine_error=_error(b), evidence={"rotating_layers": rotating})
    if m.max_kv_size is not None and m.max_kv_size_honored is False:
        full = sum(r.layers for r in b.layer_kinds if r.cache == "KVCache")
        per_request = b.capacity.per_request_bytes
        yield Finding.at("MEM012", f"{name}: {facts.model_type} builds its own caches (make_cache), so --max-kv-size "
                                   f"{m.max_kv_size} is ignored: {full} layers keep growing with the context",
                         where.get("max_kv_size"),
                         evidence={"unbounded_layers": full,
                                   "per_request_bytes": None if per_request is UNSET else per_request})



def run(ctx: Context) -> Iterable[Finding]:
    settings = ctx.deploy.budget
    if settings is None or (settings.kv_budget is None and settings.gpu_memory is None and settings.gpu is not None):
        return []  # a GPU preset alone asks for the whole fit (kvdoctor.checks.fit), not a KV budget
    from kvdoctor.engines.budget.run import plan_engine
    from kvdoctor.engines import budget_engines
    from kvdoctor.errors import InputError

    out: list[Finding] = []
    for engine in settings.engines or budget_engines():
        try:  # the layers as this engine sizes them; `kvdoctor budget` says why an engine cannot
            facts = profile(engine).budget_facts(ctx.spec)
        except InputError:
            continue
        budgets, _ = plan_engine(engine, facts, ctx.spec.config, settings, ctx.deploy.settings(engine),
                                 all_modes=False)
        where = deploy_sources(ctx.deploy, engine)
        # `check --engine vllm`: the plan already reports the start-up refusals it shares with the budget
        planned = {r.code for r in ctx.plan.refusals} if engine == ctx.engine else set()
        for budget in budgets:
            out.extend(f for f in findings_for(facts, budget, where) if f.code not in planned)
    return out


def _setting(deploy: Deploy, section: str, key: str, name: str) -> Source:
    """A knob's source; one left at its default keeps the name it had under `budget:` (`name`), so that
    the fingerprints of findings that point at it (and the baselines holding them) stay as they were."""
    source = deploy.source(f"{section}.{key}")
    return Source("default", f"budget.{section}.{name}") if source.kind == "default" else source


def deploy_sources(deploy: Deploy, engine: str) -> dict[str, Any]:
    """Where each setting a MEM finding may point at comes from (`_cudagraph_full`: vLLM's graph mode)."""
    section = section_name(engine)
    named = profile_class(engine).budget_setting_keys
    where: dict[str, Any] = {name: _setting(deploy, section, key, name) for name, key in named.items()}
    where["context"] = deploy.source("budget.context")
    where["kv_budget"] = deploy.source("budget.kv_budget")
    settings = deploy.settings(engine)
    if hasattr(settings, "cudagraph_full"):  # vLLM's graph mode
        where["_cudagraph_full"] = settings.cudagraph_full
    return where
