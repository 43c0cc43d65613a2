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

from kvdoctor.engines.budget.weights import COMMON_RULES, Parallel, ShardRules

RULES = ShardRules(rules=COMMON_RULES, vocab_padding=64,
                   source="vllm 0.33.0 model_executor/layers/linear.py, vocab_parallel_embedding.py:36,95, "
                          "fused_moe/layer.py, distributed/utils.py:198-240")


def parallel(tp: int, pp: int = 1, dp: int = 1, expert_parallel: bool = False) -> Parallel:
    """vLLM's layout: DP replicates the whole model; EP spans TP x DP ranks."""
    return Parallel(tp=tp, pp=pp, dp=dp, ep=tp * dp if expert_parallel else 1)
