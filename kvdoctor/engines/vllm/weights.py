"""vLLM 0.33.0's split of each checkpoint tensor over its parallel groups (data for
`kvdoctor.engines.budget.weights`).

Read from the pinned wheel: model_executor/layers/linear.py (ColumnParallelLinear,
MergedColumnParallelLinear, QKVParallelLinear with KV heads replicated when TP exceeds them,
RowParallelLinear whose bias only rank 0 adds but every rank holds, ReplicatedLinear),
vocab_parallel_embedding.py (DEFAULT_VOCAB_PADDING_SIZE = 64, line 36; pad_vocab_size, line 95),
fused_moe/layer.py (experts over the EP group, which is TP x DP when --enable-expert-parallel is on)
and models/deepseek_v2.py (MLA's q_a_proj and kv_a_proj_with_mqa are ReplicatedLinear).
"""
from __future__ import annotations

from kvdoctor.engines.budget.weights import COMMON_RULES, Parallel, ShardRules, padding_bytes
from kvdoctor.engines.vllm.releases import MXFP4_ALIGN

RULES = ShardRules(rules=COMMON_RULES, vocab_padding=64,
                   source="vllm 0.33.0 model_executor/layers/linear.py, vocab_parallel_embedding.py:36,95, "
                          "fused_moe/layer.py, distributed/utils.py:198-240")


def parallel(tp: int, pp: int = 1, dp: int = 1, expert_parallel: bool = False) -> Parallel:
    """vLLM's layout: DP replicates the whole model; EP spans TP x DP ranks."""
    return Parallel(tp=tp, pp=pp, dp=dp, ep=tp * dp if expert_parallel else 1)


# --quantization fp8 on a checkpoint with no quantization_config: Fp8Config with is_checkpoint_fp8_serialized off gives
# every LinearBase layer Fp8OnlineLinearMethod, which loads the float weights and keeps them as float8_e4m3fn with a
# per-tensor scale (ops.scaled_fp8_quant in process_weights_after_loading), and the routed experts Fp8MoEMethod;
# the embeddings, head and norms are no LinearBase and stay in the serving dtype. 0.19.0 logs it ("Selected
# CutlassFP8ScaledMMLinearKernel for Fp8OnlineLinearMethod", llm-d-incubation/llm-d-planner PR #205); 0.33.0's
# Fp8Config refuses it ("The `fp8` quantization method no longer supports online quantization").
ONLINE_FP8_SOURCE = ("--quantization fp8: linear layers and experts quantized to FP8 as loaded "
                     "(model_executor/layers/quantization/fp8.py Fp8OnlineLinearMethod @ 0.19.0)")


def online_quantization(config: dict, method: object) -> tuple[int, str] | None:
    """The byte width vLLM quantizes a float checkpoint's linear weights to as it loads them, and where that
    comes from; None where the checkpoint is already quantized or no online method is asked for."""
    if method != "fp8" or config.get("quantization_config") or (config.get("text_config") or {}).get(
            "quantization_config"):
        return None
    return 1, ONLINE_FP8_SOURCE


def _gpu_class(sm: int) -> str | None:
    return "hopper" if sm == 90 else "ampere" if 80 <= sm < 90 else "blackwell" if sm >= 100 else None


def mxfp4_padding(config: dict, expert_bytes: int, sm: int, tp: int, expert_parallel: bool,
                  version: str) -> tuple[int, str]:
    """Bytes the MXFP4 kernel's padding adds to a rank's experts, and where the alignment comes from
    (0 where the checkpoint is not MXFP4 or the GPU's class is not known)."""
    if (config.get("quantization_config") or {}).get("quant_method") != "mxfp4" or not expert_bytes:
        return 0, ""
    cls = _gpu_class(sm)
    hidden = int(config.get("hidden_size") or 0)
    inter = int(config.get("intermediate_size") or 0)
    if cls is None or not hidden or not inter:
        return 0, ""
    try:
        ranged = next(r for r in MXFP4_ALIGN if r.holds(version))
    except StopIteration:
        return 0, ""
    h_align, i_align = ranged.value[cls]
    per_rank = inter if expert_parallel else inter // tp
    return padding_bytes(expert_bytes, hidden, per_rank, h_align, i_align), ranged.source
