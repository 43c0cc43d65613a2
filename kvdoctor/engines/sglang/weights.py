"""SGLang 0.5.23's split of each checkpoint tensor over its parallel groups (data for
`kvdoctor.engines.budget.weights`).

SGLang's srt/layers/linear.py and vocab_parallel_embedding.py keep vLLM's layer classes and its
vocabulary padding of 64; its attention data parallelism (--enable-dp-attention with --dp-size D)
splits the attention layers over TP / D ranks while the MLP and the experts stay split over the whole
TP group (srt/layers/dp_attention.py); --ep-size spreads routed experts over that many ranks.
"""
from __future__ import annotations

from kvdoctor.engines.budget.weights import COMMON_RULES, Parallel, ShardRules
from kvdoctor.errors import InputError

RULES = ShardRules(rules=COMMON_RULES, vocab_padding=64,
                   source="sglang 0.5.23 srt/layers/linear.py, srt/layers/vocab_parallel_embedding.py, "
                          "srt/layers/dp_attention.py, srt/layers/moe/")


def parallel(tp: int, pp: int = 1, dp: int = 1, ep: int = 1, dp_attention: bool = False) -> Parallel:
    """SGLang's layout: with attention DP the DP ranks share the TP group's GPUs."""
    if dp_attention and tp % dp:
        raise InputError(f"--dp-size {dp} must divide --tp-size {tp} with --enable-dp-attention")
    return Parallel(tp=tp, pp=pp, dp=dp, ep=ep, attn_tp=tp // dp if dp_attention else None)
