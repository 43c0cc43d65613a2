"""vLLM's whole start-up arithmetic for one parallel layout on one GPU: weights on each rank, the memory
its profiler leaves for the KV cache, and what that cache serves (through `vllm.budget`).

Up to 0.33 (and from 0.34.0 with `enable_extensible_kv_cache: false` or a KV budget given), estimated:
available KV = ceil(total x gpu_memory_utilization)              v1/worker/utils.py:724-726
               - (weights + non-torch memory + activation peak)  utils/mem_utils.py:305-321 (non_kv_cache_memory)
               - CUDA graph estimate                              v1/worker/gpu_worker.py:702-756, on by default
                                                                  since 0.21 (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
From 0.34.0 (the extensible KV cache, on by default on CUDA), measured after warm-up and CUDA graph capture
(v1/worker/extensible_kv_cache.py:592-618 @ 0.34.0, `measure_kv_cache_bytes`):
available KV = min(ceil(total x gpu_memory_utilization) - used,   utilization 1.0 unless given (config/cache.py:495-501)
                   free at start-up - used - margin) - transient
  used      = weights + non-torch memory + CUDA graphs (the captured pool)
  transient = activation peak + CUDA graph estimate               gpu_worker.py:771-773, 946-948 (peak_activation_memory)
  margin    = max(1 GiB, 0.75 x transient)                        extensible_kv_cache.py:64-65
The weights are exact (the checkpoint's headers, split as vLLM's layers split them). The activation
peak, the non-torch memory and the CUDA graphs are measured by vLLM on the GPU; kvdoctor models them
and says how each model was obtained (`Term.source`); docs/fit.md gives their error on real logs.
"""
from __future__ import annotations

import math
from typing import Any

from msgspec.structs import replace

from kvdoctor.engines.budget.common import CUDA_CONTEXT, GiB, MiB, EngineRefusal
from kvdoctor.engines.budget.facts import ModelFacts, dtype_bytes
from kvdoctor.engines.budget.fit import FitRow, Gpu, Request, Term, stage_facts, weights_do_not_fit
from kvdoctor.engines.budget.weights import weights_per_rank
from kvdoctor.engines.pins import PINS, PROFILED
from kvdoctor.engines.releases import Ranged
from kvdoctor.engines.vllm import budget as vb
from kvdoctor.engines.vllm.budget import in_force
from kvdoctor.engines.vllm import releases as R
from kvdoctor.engines.vllm import weights as vw
from kvdoctor.model import ModelSpec

VERSION = PINS["vllm"]
# Memory in use before the worker's start-up snapshot (the CUDA context; NCCL in a TP group), which the measured
# sizing's "free at start-up" leaves out: (alone, in a TP group) from the "Free memory on device: X/Y GiB on startup"
# lines of the vLLM 0.11 calibration logs on H100 (78.57/79.18 GiB at TP 1, five logs; 77.64/79.18 at TP 2).
START_UP_USED = (int(0.61 * GiB), int(1.54 * GiB))
# Scheduler defaults of the OpenAI server by GPU class (engine/arg_utils.py:2973-3006 @ 0.33.0).
BATCHED_TOKENS = {"xl": 16384, "large": 8192, "small": 2048}
MAX_NUM_SEQS = {"xl": 1024, "large": 1024, "small": 256}
# Calibrated terms (docs/fit.md lists the logs): bytes per scheduled token of the forward pass's peak,
# in units of the activation width, and the fixed non-torch memory (CUDA context, cuBLAS workspaces, NCCL).
FORWARD_WIDTHS = (3, 3)  # (x intermediate per rank, x hidden): vllm-project/vllm#10517 at 20k and 29k tokens
# Non-torch memory the profiler charges one rank (what grows outside torch's allocator between the worker's init
# snapshot and the end of the profiling run), by release, as (alone, a pipeline rank with TP 1, a rank of a TP
# group). Before 0.19: 0.13-0.14 GiB at TP 1 and 0.54-0.55 GiB at TP 2 in the vLLM 0.11 calibration logs on H100.
# From 0.19 the profiler prints it ("non-torch forward increase memory", v1/worker/gpu_worker.py:435 @ 0.19.0):
# 0.25-0.27 GiB alone (7 logs), 0.07 on PP ranks (2 logs), 2.07-2.17 GiB in TP groups of 2 and 4 (4 logs:
# gpt-oss-20b, Mixtral, Qwen2.5-7B, Llama-4-Scout). The TP group's buffers come after the init snapshot (whose
# non-torch memory, 1.5-2.0 GiB there, is not charged): the FlashInfer all-reduce fusion workspace the compile
# pass creates (device_communicators/flashinfer_all_reduce.py) and NCCL's buffers, connected at the first
# collective. The figures are the printed ones, not sizes read from the code.
NON_TORCH = (((0, 19), (CUDA_CONTEXT, 563 * MiB, 563 * MiB)), ((999,), (266 * MiB, 72 * MiB, 2150 * MiB)))
# The dummy sampler run over max_num_seqs rows of fp32 logits peaks at about this many copies of them, by
# release: 10.3 with the V0 sampler and 256 sequences (vllm-project/vllm#10511); 9.62-9.73 with V1's sort-based
# top-k/top-p (logits, probabilities, sorted values and indices) on the three families of the vLLM 0.11
# calibration logs; 3.5 once top-k/top-p runs in place in a Triton kernel (vllm-project/vllm#33538, merged
# 2026-02): the model's logits (half precision, 0.5), their fp32 copy, the softmax and the exponential noise,
# the noise divided in place (v1/sample/sampler.py:96, ops/topk_topp_sampler.py:345-360,438-469 @ 0.26.0).
# The held-out vLLM 0.19.0 logs show it (1.89 GiB of peak for a 128k vocabulary, 2.21 for 152k, 3.6-4.0 for
# Gemma's 256k, at 1024 sequences). Its first release is 0.17.0: apply_top_k_top_p hands batches of 8 rows or more
# to the Triton kernel there (v1/sample/ops/topk_topp_sampler.py:245-255 @ 0.17.0; ops/topk_topp_triton.py is new
# in 0.17.0, absent from 0.16.0), as llm-d-planner's Qwen3-14B version sweep shows (activation peak 5.64 GiB on
# 0.15.0 and 0.16.0, 2.23 GiB on 0.17.0 and 0.18.0).
SAMPLER_COPIES = (((0, 8), 10.3), ((0, 17), 9.7), ((999,), 3.5))
# CUDA graphs (subtracted from the KV memory since 0.21): vLLM captures the first two graphs of each mode and
# extrapolates to all (v1/worker/gpu_model_runner.py:6268-6380 @ 0.33.0). kvdoctor prices each graph at this
# many bytes per layer and unit of activation width (hidden + active intermediate per rank): 9-14 on three
# calibration logs (the graphs captured by Qwen2-7B at 0.10.1 and gpt-oss-20b at 0.11, and 0.21's estimate for
# Qwen3-8B; gpt-oss-120b at 0.11 measured 20), docs/fit.md.
GRAPH_BYTES_PER_LAYER_WIDTH = 12
# The first release whose fused-MoE workspaces stay allocated between forward passes (the workspace manager; seen in
# 0.14's and 0.19's fused_moe/modular_kernel.py, the releases between 0.11 and 0.14 not read).
MOE_WORKSPACE_PERSISTENT = (0, 14)
SOURCES = {
    "requested": "vllm/v1/worker/utils.py:724-726 @ 0.33.0 (ceil(total x gpu_memory_utilization))",
    "weights": "exact: safetensors headers split as vllm 0.33.0's layers split them (vllm/weights.py)",
    "activations": "max(forward peak, sampler peak) + fused-MoE workspaces: forward = max_num_batched_tokens x (3 x intermediate/TP "
                   "+ 3 x hidden) x dtype (vllm-project/vllm#10517); sampler = max_num_seqs x vocab x 4 B x {copies} "
                   "(v1/worker/gpu_model_runner.py:5866-5900): 10.3 before 0.8, 9.7 calibrated on 5 logs of 0.11 for the sort-based "
                   "top-k/top-p, 3.5 counted in the in-place Triton path from 0.19 (docs/fit.md)",
    "non_torch": "by release (docs/fit.md): before 0.19, calibrated on 7 logs of 0.11: 0.13 GiB alone, 0.55 GiB "
                 "with other ranks; from 0.19, the profiler's printed figure on 13 logs of 0.19.0: 0.26 GiB alone, "
                 "0.07 GiB on a PP rank, 2.1 GiB in a TP group (all-reduce workspaces and NCCL buffers)",
    "cuda_graphs": "v1/worker/gpu_worker.py:702-756 @ 0.33.0 (subtracted since 0.21): {graphs} graphs (capture sizes "
                   "of config/vllm.py:2398-2470, FULL and PIECEWISE) x layers x (hidden + intermediate/TP) x 12 B, "
                   "calibrated on 3 logs (docs/fit.md)",
    "kv": "what is left: v1/worker/gpu_worker.py:752-756 @ 0.33.0",
    "requested_measured": "vllm/v1/worker/utils.py:743 @ 0.34.0 (ceil(total x resolved_gpu_memory_utilization), "
                          "config/cache.py:495-501: 1.0 with the extensible KV cache unless given)",
    "cuda_graphs_measured": "the captured pool, in the memory measured after capture (gpu_worker.py:1103 @ 0.34.0), "
                            "priced as the estimate: {graphs} graphs x layers x (hidden + intermediate/TP) x 12 B",
    "reserved": "extensible KV cache's headroom (v1/worker/extensible_kv_cache.py:592-618 @ 0.34.0): margin "
                "max(1 GiB, 0.75 x transient) = {margin:.2f} GiB (extensible_kv_cache.py:64-65); the transient kept "
                "free is the activation peak plus the CUDA graph estimate again (peak_activation_memory, "
                "gpu_worker.py:771-773 and 946-948), the estimate {graphs:.2f} GiB here; memory in use before the "
                "start-up snapshot {start:.2f} GiB (calibrated, START_UP_USED); warm-up's own peak and torch's "
                "reservation growth, where larger, are not modelled",
    "kv_measured": "what is left after warm-up and capture: v1/worker/extensible_kv_cache.py:612-618 @ 0.34.0 "
                   "(measure_kv_cache_bytes)",
}


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def gpu_tier(gpu: Gpu) -> str:
    if gpu.memory_bytes >= 160 * GiB:
        return "xl"
    return "large" if gpu.large_tier else "small"


def widths(config: dict[str, Any]) -> tuple[int, int]:
    """(hidden, intermediate width one token activates: a dense MLP's, or top-k experts' plus the shared one)."""
    hidden = int(config.get("hidden_size") or 0)
    experts = config.get("num_experts_per_tok") or config.get("moe_topk")
    inter = int(config.get("intermediate_size") or 0)
    if experts and config.get("moe_intermediate_size"):
        inter = int(config["moe_intermediate_size"]) * int(experts) + int(config.get("shared_expert_intermediate_size")
                                                                          or 0)
    return hidden, inter


def capture_sizes(seqs: int, tokens: int, gpu: Gpu) -> tuple[int, int]:
    """(PIECEWISE graphs, FULL decode graphs) vLLM 0.33.0 captures by default: sizes 1, 2, 4, then steps of 8 to
    256 and of 16 above, up to min(2 x max_num_seqs, 512; 1024 on datacenter Blackwell, max_num_batched_tokens)
    (config/vllm.py:2398-2470); the FULL graphs cover the decode batches up to max_num_seqs."""
    largest = min(2 * seqs, 1024 if gpu.sm >= 100 else 512, tokens)
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)] if s <= largest]
    return len(sizes), len([s for s in sizes if s <= seqs])


def cuda_graphs(config: dict[str, Any], layers: int, tp: int, seqs: int, tokens: int, gpu: Gpu) -> tuple[int, int]:
    """(bytes, graphs) of vLLM's CUDA graph estimate on one rank (modelled: see SOURCES)."""
    hidden, inter = widths(config)
    graphs = sum(capture_sizes(seqs, tokens, gpu))
    return graphs * layers * (hidden + inter // tp) * GRAPH_BYTES_PER_LAYER_WIDTH, graphs


def sampler_copies(version: str) -> float:
    """Copies of the fp32 logits the dummy sampler run holds at its peak in `version` (see SAMPLER_COPIES)."""
    return next(copies for before, copies in SAMPLER_COPIES if version_tuple(version) < before)


def non_torch_memory(version: str, tp: int, others: int) -> int:
    """Non-torch memory charged to one rank of `version` (see NON_TORCH); `others`: the PP x DP ranks beside it."""
    alone, pipeline, group = next(sizes for before, sizes in NON_TORCH if version_tuple(version) < before)
    if tp > 1:
        return group
    return pipeline if others > 1 else alone


def moe_workspace(config: dict[str, Any], tp: int, tokens: int, ep: bool, width: int) -> int:
    """Bytes of the fused-MoE kernel's two workspaces on one rank for a batch of `tokens` (0 for a dense model):
    (M, topk, max(N/2, K)) shared with the (M, K) output, and (M, topk, max(N, K)), N the gate-and-up width per
    rank, K the hidden size (TritonExperts.workspace_shapes, fused_moe/fused_moe.py; _allocate_buffers,
    fused_moe/modular_kernel.py)."""
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
    topk = config.get("num_experts_per_tok") or config.get("moe_topk") or config.get("experts_per_token")
    inter = config.get("moe_intermediate_size") or config.get("intermediate_size")
    if not (experts and topk and inter):
        return 0
    k, n = int(config.get("hidden_size") or 0), 2 * int(inter) // (1 if ep else tp)
    m, topk = tokens, int(topk)
    return (max(m * topk * max(n // 2, k), m * k) + m * topk * max(n, k)) * width


def vocab_size(spec: ModelSpec) -> int:
    """The logits' width: the config's vocab_size, or the rows of the checkpoint's input embedding where the
    config leaves it to its class (Gemma-3's text_config)."""
    if spec.config.get("vocab_size"):
        return int(spec.config["vocab_size"])
    rows = [shape[0] for name, _dtype, shape, _file in (spec.checkpoint.tensors.values() if spec.checkpoint else [])
            if name.endswith("embed_tokens.weight") and shape]
    return max(rows, default=0)


def indivisible(facts: ModelFacts, vocab: int, tp: int) -> EngineRefusal | None:
    """The assertion vLLM's layers stop on while the model is built, where TP does not divide what they split:
    the input embedding first (its rows padded to 64, vocab_parallel_embedding.py:304), then each attention
    layer's KV heads, or TP by the KV heads where TP exceeds them (QKVParallelLinear, linear.py:1065-1070); both
    through distributed/utils.py:51-55 and 130-134 @ 0.33.0 ("151936 is not divisible by 5": Qwen3-14B at TP 5,
    vLLM 0.19.0, llm-d-incubation/llm-d-planner PR #205)."""
    pairs = [(math.ceil(vocab / vw.RULES.vocab_padding) * vw.RULES.vocab_padding, tp)] if vocab else []
    if facts.kv_heads and not facts.mla_latent:
        pairs.append((tp, facts.kv_heads) if tp >= facts.kv_heads else (facts.kv_heads, tp))
    for numerator, denominator in pairs:
        if numerator % denominator:
            return EngineRefusal("AssertionError", f"{numerator} is not divisible by {denominator}", stage="load")
    return None


def activation_peak(facts: ModelFacts, config: dict[str, Any], tp: int, tokens: int, seqs: int,
                    version: str, ep: bool = False, vocab: int = 0) -> int:
    """The profiling run's peak above the weights on one rank (modelled: see SOURCES). The fused-MoE
    workspaces are the forward pass's until 0.14, then persistent buffers of vLLM's workspace manager
    (v1/worker/workspace.py) that the sampler run finds still held."""
    hidden, inter = widths(config)
    width = dtype_bytes(facts.serving_dtype)
    forward = tokens * (FORWARD_WIDTHS[0] * inter // tp + FORWARD_WIDTHS[1] * hidden) * width
    copies = sampler_copies(version)
    sampler = int(seqs * vocab * 4 * copies)
    workspace = moe_workspace(config, tp, tokens, ep, width)
    if version_tuple(version) >= MOE_WORKSPACE_PERSISTENT:
        return max(forward, sampler) + workspace
    return max(forward + workspace, sampler)


def measured_kv(total: int, requested: int, used: int, transient: int, start_up_used: int,
                version: str) -> tuple[int, int]:
    """(KV bytes, margin) of the extensible KV cache's sizing after warm-up (`measure_kv_cache_bytes`): the
    requested memory less what the engine holds, capped by the memory free at start-up less the margin, less the
    transient peak kept free."""
    floor, share = in_force(R.EXTENSIBLE_MARGIN, version)
    margin = max(floor, int(transient * share))
    return min(requested - used, total - start_up_used - used - margin) - transient, margin


def scheduler_defaults(version: str, gpu: Gpu, context: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of the OpenAI server when the deployer sets neither: the
    pinned release's table by GPU class; before the V1 engine (0.8), 256 sequences and one whole prompt
    of max_model_len tokens, or 512 with the chunked prefill it turned on above 32k."""
    if version_tuple(version) < (0, 8):
        return (max(context, 2048) if context <= 32768 else 512), 256
    tier = gpu_tier(gpu)
    return BATCHED_TOKENS[tier], MAX_NUM_SEQS[tier]


def fit(spec: ModelSpec, facts: ModelFacts, gpu: Gpu, layout: dict[str, Any], request: Request,
        settings: dict[str, Any] | None = None) -> FitRow:
    """One layout (tp, pp, dp, expert_parallel) on `gpu`: the fullest rank's memory and what it serves.
    `settings` holds vLLM's own knobs (gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
    enforce_eager, ...) where the deployer sets them; `kv_budget` replaces the modelled memory with the
    engine's own figure; `version` prices an older release's defaults (start-up logs)."""
    s = settings or {}
    version = str(s.get("version") or VERSION)
    tp, pp, dp = int(layout.get("tp", 1)), int(layout.get("pp", 1)), int(layout.get("dp", 1))
    ep = bool(layout.get("expert_parallel", False))
    util, measured = vb.utilization(version, s)
    context = request.context or facts.max_position or 0
    default_tokens, default_seqs = scheduler_defaults(version, gpu, context)
    tokens = int(s.get("max_num_batched_tokens") or default_tokens)
    seqs = int(s.get("max_num_seqs") or default_seqs)
    assert spec.checkpoint is not None
    if s.get("dtype") not in (None, "auto"):  # --dtype: the weights, activations and KV cache in that dtype
        facts = replace(facts, dtype=str(s["dtype"]))
    online = vw.online_quantization(spec.config, s.get("quantization"))
    weights = weights_per_rank(spec.checkpoint, spec.config, vw.RULES, vw.parallel(tp, pp, dp, ep), spec.num_hidden_layers,
                               dtype_bytes(facts.serving_dtype), online[0] if online else None)
    if online:
        weights = replace(weights, source=f"{weights.source}; {online[1]}")
    padding, padding_source = vw.mxfp4_padding(spec.config, weights.by_kind.get("expert", 0), gpu.sm, tp,
                                               ep, version)
    if padding:  # the MoE kernel's tile padding of MXFP4 experts, loaded into the padded shapes
        weights = replace(weights, bytes_per_rank=weights.bytes_per_rank + padding,
                          by_kind={**weights.by_kind, "expert": weights.by_kind["expert"] + padding},
                          source=f"{weights.source}; MXFP4 expert padding +{padding / GiB:.2f} GiB: {padding_source}")
    requested = math.ceil(gpu.memory_bytes * util)
    activations = activation_peak(facts, spec.config, tp, tokens, seqs, version, ep, vocab_size(spec))
    graphs, graph_count = 0, 0
    if not s.get("enforce_eager") and version_tuple(version) >= (0, 21):
        layers = max(last - first for first, last in weights.stage_layers)
        graphs, graph_count = cuda_graphs(spec.config, layers, tp, seqs, tokens, gpu)
    copies = sampler_copies(version)
    non_torch = non_torch_memory(version, tp, pp * dp)
    kv = requested - weights.bytes_per_rank - activations - non_torch - graphs
    reserved: Term | None = None
    if measured:
        start_up_used = START_UP_USED[1 if tp > 1 else 0]
        kv, margin = measured_kv(gpu.memory_bytes, requested, weights.bytes_per_rank + non_torch + graphs,
                                 activations + graphs, start_up_used, version)
        reserved = Term(name="reserved", bytes=kv_held_back(requested, weights.bytes_per_rank, activations, non_torch,
                                                             graphs, kv),
                        source=SOURCES["reserved"].format(margin=margin / GiB, graphs=graphs / GiB,
                                                          start=start_up_used / GiB))
    if s.get("kv_budget") is not None:  # the engine's own figure, from a log or a profiled run
        from kvdoctor.load.strict import parse_size

        kv = parse_size(s["kv_budget"], "kv_budget") if isinstance(s["kv_budget"], str) else int(s["kv_budget"])
        kv_source = "given (kv_budget)"
    else:
        kv_source = SOURCES["kv_measured" if measured else "kv"]
    terms = [Term(name="requested", bytes=requested, source=SOURCES["requested_measured"] + f": {util}" if measured
                  else SOURCES["requested"] + f" with {util}"),
             Term(name="weights", bytes=weights.bytes_per_rank, source=SOURCES["weights"]),
             Term(name="activations", bytes=activations, source=SOURCES["activations"].format(copies=copies)),
             Term(name="non_torch", bytes=non_torch, source=SOURCES["non_torch"]),
             Term(name="cuda_graphs", bytes=graphs, source=SOURCES["cuda_graphs_measured" if measured else "cuda_graphs"]
                  .format(graphs=graph_count) if graphs else "enforce_eager or before 0.21: not subtracted"),
             *([reserved] if reserved is not None else []),
             Term(name="kv", bytes=max(kv, 0), source=kv_source),
             Term(name="free", bytes=gpu.memory_bytes - requested, source="outside gpu_memory_utilization")]
    row = FitRow(engine="vllm", version=version, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, gpus=tp * pp * dp,
                 layout={"tp": tp, "pp": pp, "dp": dp, "expert_parallel": ep}, weights=weights, terms=terms,
                 kv_bytes=kv, context=context)
    if facts.kv_heads and tp > facts.kv_heads and not facts.mla_latent:
        row.notes.append(f"TP {tp} exceeds the {facts.kv_heads} KV heads: each rank keeps a copy of one KV head "
                         f"({tp // facts.kv_heads} ranks share each head)")
    if weights.unmatched:
        row.notes.append(f"{len(weights.unmatched)}+ tensors no sharding rule names were priced whole on every rank "
                         f"(e.g. {weights.unmatched[0]})")
    if facts.attention_heads and facts.attention_heads % tp:  # ModelConfig.verify_with_parallel_config
        row.refusal = EngineRefusal("ValidationError", f"Total number of attention heads ({facts.attention_heads}) must "
                                    f"be divisible by tensor parallel size ({tp}).")  # config/model.py:1557-1564 @ 0.33.0
        return row
    row.refusal = indivisible(facts, vocab_size(spec), tp)
    if row.refusal is None and s.get("kv_budget") is None:  # given the engine's KV figure, it did load the weights
        row.refusal = weights_do_not_fit(weights, non_torch, gpu, "vLLM")
    if row.refusal is not None:
        return row
    # the extensible cache reserves its range at the estimate and is checked there first, before warm-up
    after_warmup = requested - weights.bytes_per_rank - activations - non_torch - graphs > 0
    if kv <= 0:
        row.refusal = EngineRefusal("ValueError", in_force(R.NO_MEMORY, version))
    else:
        _serve(row, facts, tp, pp, kv, context, request, s, tokens, seqs)
    if measured and row.refusal is not None:  # 0.34.0's advice for the extensible KV cache in both memory refusals
        row.refusal = EngineRefusal(row.refusal.cls, row.refusal.message.replace(
            R.ESTIMATE_HINT, extensible_hint(util, after_warmup)), stage=row.refusal.stage)
    if kv <= 0:
        return row
    row.launch = launch(spec, row, util, request, s)
    row.deploy = {"tensor_parallel_size": tp, **({"pipeline_parallel_size": pp} if pp > 1 else {}),
                  **({"data_parallel_size": dp} if dp > 1 else {}), **({"enable_expert_parallel": True} if ep else {}),
                  "max_model_len": context, **({"gpu_memory_utilization": util} if s.get("gpu_memory_utilization") else {}),
                  **({"enable_extensible_kv_cache": s["enable_extensible_kv_cache"]}
                     if s.get("enable_extensible_kv_cache") is not None else {}),
                  **({"kv_cache_dtype": request.kv_cache_dtype} if request.kv_cache_dtype else {})}
    return row


def extensible_hint(util: float, after_warmup: bool) -> str:
    """The advice 0.34.0's two memory refusals give when the extensible KV cache is short, before warm-up (at the
    reserved range's estimate) or after it (`_more_kv_cache_memory_hint`, v1/core/kv_cache_planning.py:64-97 @
    0.34.0; its text verbatim). A context whose one request misses the estimate too is refused before warm-up with
    the estimate's figures; fit prints the measured ones."""
    used_by = "the model, its activations, CUDA graphs and warmup" if after_warmup else "the model and its activations"
    graphs = " CUDA graphs take less with fewer or smaller capture sizes in the compilation config." if after_warmup else ""
    if util < 1.0:
        return (f"The KV cache gets what is left after {used_by} within `gpu_memory_utilization`={util}; increase it "
                f"(with the extensible KV cache it defaults to 1.0) or decrease `max_model_len` or `max_num_seqs`.{graphs}")
    return (f"The extensible KV cache already takes all device memory left after {used_by}; decrease `max_model_len` "
            f"or `max_num_seqs`, or the model needs a device with more memory.{graphs}")


def kv_held_back(requested: int, weights: int, activations: int, non_torch: int, graphs: int, kv: int) -> int:
    """What the measured sizing keeps out of the KV cache beyond the other terms (its margin, the graph estimate in
    the transient, the memory in use before start-up), so that the terms add up to the requested memory."""
    return requested - weights - activations - non_torch - graphs - max(kv, 0)


def _plan_stages(row: FitRow, facts: ModelFacts, tp: int, pp: int, kv: int, length: int, request: Request,
                 s: dict[str, Any], tokens: int, seqs: int) -> vb.VllmBudget:
    """vLLM's KV plan on each pipeline stage's own layers; the stage that serves least (or refuses) decides."""
    worst: vb.VllmBudget | None = None
    # a profiled release plans its own caches (block size, admission margin); a start-up log's older one, the pin's
    release = str(row.version) if str(row.version) in PROFILED["vllm"] else VERSION
    for stage in stage_facts(facts, row.weights.stage_layers, pp):
        mode = vb.Mode(max_model_len=length, kv_budget_bytes=kv, kv_cache_dtype=request.kv_cache_dtype or "auto",
                       tp=tp, prefix_caching=s.get("enable_prefix_caching") is not False, max_num_batched_tokens=tokens,
                       max_num_seqs=seqs, release=release)
        result = vb.plan(stage, mode)
        if worst is None or (result.error is not None and worst.error is None) or (
                (result.error is None) == (worst.error is None)
                and (result.capacity.max_concurrency or 0) < (worst.capacity.max_concurrency or 0)):
            worst = result
    assert worst is not None
    return worst


def _serve(row: FitRow, facts: ModelFacts, tp: int, pp: int, kv: int, context: int, request: Request,
           s: dict[str, Any], tokens: int, seqs: int) -> None:
    """Concurrency at the requested context, and the longest context one request can have (what
    `--max-model-len auto` would pick, up to the model's own maximum)."""
    longest = max(context, facts.max_position or context)
    auto = _plan_stages(row, facts, tp, pp, kv, longest, request, s, tokens, seqs)
    fit_len = auto.capacity.max_model_len_fit
    row.max_context = fit_len if isinstance(fit_len, int) else None
    worst = auto if longest == context else _plan_stages(row, facts, tp, pp, kv, context, request, s, tokens, seqs)
    row.notes.extend(worst.notes)
    if worst.error is not None:
        row.refusal = worst.error
        return
    row.max_concurrency = float(worst.capacity.max_concurrency or 0.0) * int(row.layout["dp"])
    row.kv_tokens = printed_tokens(worst, str(row.version))
    row.fits = row.max_concurrency >= (request.concurrency or 1)


# What "GPU KV cache size: N tokens" prints: the pool's blocks split evenly over the cache groups, times the
# smallest block (vllm-project/vllm#40691 quotes it at 0.19.0, v1/core/kv_cache_utils.py _report_kv_cache_config),
# then max_concurrency x max_model_len (v1/core/kv_cache_utils.py:1121-1128 @ 0.33.0). The release between 0.19.0
# and 0.33.0 that changed it was not read; 0.20.0 is taken as the first.
PRINTED_TOKENS_PER_GROUP: tuple[Ranged[bool], ...] = (
    Ranged(True, until="0.20.0", source="vllm-project/vllm#40691 (0.19.0)"),
    Ranged(False, since="0.20.0", source="vllm 0.33.0 v1/core/kv_cache_utils.py:1121-1128"),
)


def printed_tokens(budget: vb.VllmBudget, version: str) -> int:
    """vLLM's "GPU KV cache size" as the release prints it."""
    if budget.pool is not None and budget.groups and in_force(PRINTED_TOKENS_PER_GROUP, version):
        return budget.pool.num_blocks // len(budget.groups) * min(g.block_size for g in budget.groups)
    return int(budget.capacity.tokens or 0)


def launch(spec: ModelSpec, row: FitRow, util: float, request: Request, s: dict[str, Any]) -> list[str]:
    """`vllm serve` with the flags that give this row (every flag one vLLM's parser accepts at the profiled releases)."""
    out = ["vllm", "serve", spec.hf_id or str(spec.model_dir), "--tensor-parallel-size", str(row.layout["tp"])]
    if row.layout["pp"] != 1:
        out += ["--pipeline-parallel-size", str(row.layout["pp"])]
    if row.layout["dp"] != 1:
        out += ["--data-parallel-size", str(row.layout["dp"])]
    if row.layout["expert_parallel"]:
        out.append("--enable-expert-parallel")
    out += ["--max-model-len", str(row.context)]
    if s.get("gpu_memory_utilization") or not in_force(R.EXTENSIBLE_KV_CACHE, str(row.version)):
        out += ["--gpu-memory-utilization", str(util)]  # from 0.34.0 only where asked: its default depends on the mode
    if s.get("enable_extensible_kv_cache") is not None:  # a BooleanOptionalAction (engine/arg_utils.py:1413 @ 0.34.0)
        out.append(("--" if s["enable_extensible_kv_cache"] else "--no-") + "enable-extensible-kv-cache")
    if request.kv_cache_dtype:
        out += ["--kv-cache-dtype", request.kv_cache_dtype]
    if s.get("dtype") not in (None, "auto"):
        out += ["--dtype", str(s["dtype"])]
    if s.get("max_num_seqs"):
        out += ["--max-num-seqs", str(s["max_num_seqs"])]
    if s.get("max_num_batched_tokens"):
        out += ["--max-num-batched-tokens", str(s["max_num_batched_tokens"])]
    if s.get("enforce_eager"):
        out.append("--enforce-eager")
    return out


def layouts(facts: ModelFacts, config: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    """The layouts of `gpus` GPUs vLLM could start, plainest first: TP alone, TP with expert parallelism
    (MoE), then TP x PP."""
    out: list[dict[str, Any]] = []
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
    for tp in sorted({d for d in range(1, gpus + 1) if gpus % d == 0}, reverse=True):
        pp = gpus // tp
        if pp > len(facts.layers):
            continue
        out.append({"tp": tp, "pp": pp, "dp": 1, "expert_parallel": False})
        if experts and tp > 1 and pp == 1:
            out.append({"tp": tp, "pp": 1, "dp": 1, "expert_parallel": True})
    return out
