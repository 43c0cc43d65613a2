"""SGLang's start-up arithmetic for one parallel layout on one GPU: weights on each rank, the memory its
`mem_fraction_static` leaves for the KV pools, and what those pools serve (through `sglang.budget`).

KV pools = free memory after loading - free memory before loading x (1 - mem_fraction_static)
          = (total - non-torch) x mem_fraction_static - weights
            srt/model_executor/model_runner.py (profile_max_num_token) up to 0.5.22,
            srt/mem_cache/kv_cache_configurator.py (_profile_available_bytes) at 0.5.23
The formula is `sglang.reserve.pool`, which `kvdoctor budget --gpu-memory` reads too. The memory in use before
loading is the CUDA context and, in a TP group, SGLang's communicators (`reserve.PRELOAD`);
the weights are exact (the headers, split as SGLang's layers split them). Activations and CUDA graphs live in
the (1 - mem_fraction_static) SGLang holds back. Without --mem-fraction-static, the fraction is SGLang's own
default for the release, GPU and layout (`sglang.reserve`).
"""
from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from kvdoctor.engines.budget.common import EngineRefusal
from kvdoctor.engines.budget.facts import ModelFacts, dtype_bytes
from kvdoctor.engines.budget.fit import FitRow, Gpu, Request, Term, stage_facts, weights_do_not_fit
from kvdoctor.engines.budget.weights import weights_per_rank
from kvdoctor.engines.pins import PINS, PROFILED
from kvdoctor.engines.sglang import budget as sb
from kvdoctor.engines.sglang import reserve
from kvdoctor.engines.sglang import weights as sw
from kvdoctor.errors import InputError
from kvdoctor.model import ModelSpec

VERSION = PINS["sglang"]
KV_DTYPES = {"fp8": "fp8_e4m3"}  # fit's --kv-cache-dtype fp8 in SGLang's spelling


def fit(spec: ModelSpec, facts: ModelFacts, gpu: Gpu, layout: dict[str, Any], request: Request,
        settings: dict[str, Any] | None = None) -> FitRow:
    s = settings or {}
    tp, pp, dp = int(layout.get("tp", 1)), int(layout.get("pp", 1)), int(layout.get("dp", 1))
    ep, dpa = int(layout.get("ep", 1)), bool(layout.get("dp_attention", False))
    assert spec.checkpoint is not None
    if s.get("dtype") not in (None, "auto"):  # --dtype: the weights and KV cache in that dtype
        facts = replace(facts, dtype=str(s["dtype"]))
    par = sw.parallel(tp, pp, dp, ep, dpa)
    weights = weights_per_rank(spec.checkpoint, spec.config, sw.RULES, par, spec.num_hidden_layers,
                               dtype_bytes(facts.serving_dtype))
    padding = sw.mxfp4_padding(spec.config, weights.by_kind.get("expert", 0), gpu.sm, tp, ep)
    if padding:  # the MoE kernel's tile padding of MXFP4 experts, loaded into the padded shapes
        weights = replace(weights, bytes_per_rank=weights.bytes_per_rank + padding,
                          by_kind={**weights.by_kind, "expert": weights.by_kind["expert"] + padding},
                          source=f"{weights.source}; MXFP4 expert padding +{padding / (1 << 30):.2f} GiB: "
                                 f"{sw.MXFP4_SOURCE}")
    release = str(s.get("version") or VERSION)
    p = reserve.pool(gpu.memory_bytes, weights.bytes_per_rank, tp, pp, dp, dpa, bool(facts.mla_latent), release,
                     chunked=s.get("chunked_prefill_size"), max_running=s.get("max_running_requests"),
                     cuda_graph=not s.get("disable_cuda_graph"), mem_fraction_static=s.get("mem_fraction_static"),
                     pcie_only=gpu.pcie_only, config=spec.raw_config)
    d, non_torch, reserved, kv, how, mfs = p.defaults, p.preload, p.reserved, p.kv, p.how, p.mem_fraction_static
    chunked = d.chunked_prefill_size
    if s.get("kv_budget") is not None:
        kv = int(s["kv_budget"])
    terms = [Term(name="reserved", bytes=reserved, source=how),
             Term(name="weights", bytes=weights.bytes_per_rank, source=f"exact: safetensors headers split as sglang "
                  f"{VERSION}'s layers split them (sglang/weights.py)"),
             Term(name="non_torch", bytes=non_torch, source=reserve.PRELOAD_SOURCE[reserve.preload_kind(tp, pp, gpu.pcie_only)]),
             Term(name="kv", bytes=max(kv, 0), source="what is left for the pools: srt/model_executor/model_runner.py")]
    context = request.context or facts.max_position or 0
    if not context:  # SGLang sizes its request slots by the context length (srt/.../model_runner.py)
        raise InputError(f"{facts.name}: the config states no context length (max_position_embeddings); give --context")
    row = FitRow(engine="sglang", version=release, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes,
                 gpus=tp * pp * (1 if dpa else dp), layout={"tp": tp, "pp": pp, "dp": dp, "ep": ep, "dp_attention": dpa},
                 weights=weights, terms=terms, kv_bytes=kv, context=context)
    attn_tp = tp // dp if dpa else tp
    if facts.attention_heads and facts.attention_heads % attn_tp:
        # a bare `assert self.total_num_heads % tp_size == 0` in the attention classes (srt/models/llama.py:183,
        # qwen2.py:167 @ 0.5.23): the message is empty
        row.refusal = EngineRefusal("AssertionError", "", stage="load")
        row.notes.append(f"the {facts.attention_heads} attention heads do not split over an attention TP of {attn_tp}")
        return row
    if s.get("kv_budget") is None:  # given the engine's own KV figure, the engine did load the weights
        row.refusal = weights_do_not_fit(weights, non_torch, gpu, "SGLang")
    if row.refusal is not None:
        return row
    if kv <= 0:
        row.refusal = sb.not_enough_memory()
        return row
    kv_dtype = KV_DTYPES.get(request.kv_cache_dtype or "auto", request.kv_cache_dtype or "auto")
    worst = None
    stages = stage_facts(facts, weights.stage_layers, pp)
    # a stage of linear-attention layers alone (Kimi-Linear's KDA at PP 8) has no token pool for SGLang's pool
    # sizing to divide by; the stages with one decide the pool, and the note says what is left unpriced
    pooled = [st for st in stages if any(layer.kind in ("full", "sliding", "mla", "dsa") for layer in st.layers)]
    if pooled and len(pooled) < len(stages):
        row.notes.append(f"{len(stages) - len(pooled)} pipeline stage(s) hold only linear-attention state; their "
                         "state pool is not priced")
    for stage in pooled or stages:
        mode = sb.Mode(context_length=context, kv_budget_bytes=kv, kv_cache_dtype=kv_dtype, tp=attn_tp,
                       chunked_prefill_size=chunked, max_running_requests=s.get("max_running_requests"),
                       release=release if release in PROFILED["sglang"] else VERSION)
        result = sb.plan(stage, mode)
        if worst is None or result.error is not None or (result.capacity.max_total_num_tokens or 0) < (
                worst.capacity.max_total_num_tokens or 0):
            worst = result
    assert worst is not None
    row.notes.extend(worst.notes)
    if worst.error is not None:
        row.refusal = worst.error
        return row
    tokens = int(worst.capacity.max_total_num_tokens or 0)
    replicas = dp  # each DP rank (or attention-DP rank) holds its own pool
    row.kv_tokens = tokens
    row.max_context = min(tokens, facts.max_position or tokens)
    row.max_concurrency = tokens / context * replicas if context else None
    if context > tokens:
        row.refusal = EngineRefusal("ValueError", f"context_length ({context}) exceeds the {tokens} tokens of the KV "
                                    "pool: no request of that length can be scheduled", stage="prefill")
        return row
    row.fits = (row.max_concurrency or 0) >= (request.concurrency or 1)
    row.launch = launch(spec, row, mfs, kv_dtype, s)
    row.deploy = {"tp_size": tp, "context_length": context, **({"pp_size": pp} if pp > 1 else {}),
                  **({"dp_size": dp, "enable_dp_attention": True} if dpa else {}),
                  **({"ep_size": ep} if ep > 1 else {}), "mem_fraction_static": mfs}
    return row


def launch(spec: ModelSpec, row: FitRow, mfs: float, kv_dtype: str, s: dict[str, Any]) -> list[str]:
    out = ["python", "-m", "sglang.launch_server", "--model-path", spec.hf_id or str(spec.model_dir),
           "--tp-size", str(row.layout["tp"])]
    if row.layout["pp"] != 1:
        out += ["--pp-size", str(row.layout["pp"])]
    if row.layout["dp"] != 1:
        out += ["--dp-size", str(row.layout["dp"])]
    if row.layout["dp_attention"]:
        out.append("--enable-dp-attention")
    if row.layout["ep"] != 1:
        out += ["--ep-size", str(row.layout["ep"])]
    out += ["--context-length", str(row.context), "--mem-fraction-static", str(mfs)]
    if kv_dtype != "auto":
        out += ["--kv-cache-dtype", kv_dtype]
    if s.get("dtype") not in (None, "auto"):
        out += ["--dtype", str(s["dtype"])]
    if s.get("max_running_requests"):
        out += ["--max-running-requests", str(s["max_running_requests"])]
    return out


def layouts(facts: ModelFacts, config: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    """TP alone; TP with expert parallelism (MoE); TP with attention DP (MLA models, whose latent KV TP
    would replicate); TP x PP."""
    out: list[dict[str, Any]] = []
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
    for tp in sorted({d for d in range(1, gpus + 1) if gpus % d == 0}, reverse=True):
        pp = gpus // tp
        if pp > len(facts.layers):
            continue
        base = {"tp": tp, "pp": pp, "dp": 1, "ep": 1, "dp_attention": False}
        out.append(base)
        if pp == 1 and tp > 1 and experts:
            out.append({**base, "ep": tp})
        if pp == 1 and tp > 1 and facts.mla_latent:
            out.append({**base, "dp": tp, "dp_attention": True})
    return out
