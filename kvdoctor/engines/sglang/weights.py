"""SGLang 0.5.23's split of each checkpoint tensor over its parallel groups (data for
`kvdoctor.engines.budget.weights`).

SGLang's srt/layers/linear.py and vocab_parallel_embedding.py keep vLLM's layer classes and its
vocabulary padding of 64; its attention data parallelism (--enable-dp-attention with --dp-size D)
splits the attention layers over TP / D ranks while the MLP and the experts stay split over the whole
TP group (srt/layers/dp_attention.py); --ep-size spreads routed experts over that many ranks.
"""
from __future__ import annotations

from typing import Any

from kvdoctor.engines.budget.weights import COMMON_RULES, Parallel, ShardRules, padding_bytes
from kvdoctor.errors import InputError

RULES = ShardRules(rules=COMMON_RULES, vocab_padding=64,
                   source="sglang 0.5.23 srt/layers/linear.py, srt/layers/vocab_parallel_embedding.py, "
                          "srt/layers/dp_attention.py, srt/layers/moe/")


def parallel(tp: int, pp: int = 1, dp: int = 1, ep: int = 1, dp_attention: bool = False) -> Parallel:
    """SGLang's layout: with attention DP the DP ranks share the TP group's GPUs."""
    if dp_attention and tp % dp:
        raise InputError(f"--dp-size {dp} must divide --tp-size {tp} with --enable-dp-attention")
    return Parallel(tp=tp, pp=pp, dp=dp, ep=ep, attn_tp=tp // dp if dp_attention else None)


# MXFP4 experts are created in padded shapes (Mxfp4MoEMethod.create_weights, srt/layers/quantization/mxfp4.py:300-321
# @ 0.5.4; the same rounding at 0.5.13): on datacenter Blackwell with the FlashInfer MXFP4 MoE runner, which
# server_args.py:940-944 @ 0.5.4 picks for gpt-oss's MXFP4 checkpoints on SM100, hidden and per-rank intermediate
# sizes to 256; elsewhere the intermediate size to 32, the MXFP4 block (Triton kernels).
MXFP4_SOURCE = "sglang 0.5.4 srt/layers/quantization/mxfp4.py:300-321, srt/server_args.py:940-944"


def mxfp4_padding(config: dict[str, Any], expert_bytes: int, sm: int, tp: int, ep: int) -> int:
    """Bytes SGLang's MXFP4 padding adds to a rank's experts (0 where the checkpoint is not MXFP4)."""
    if (config.get("quantization_config") or {}).get("quant_method") != "mxfp4" or not expert_bytes:
        return 0
    hidden, inter = int(config.get("hidden_size") or 0), int(config.get("intermediate_size") or 0)
    if not hidden or not inter:
        return 0
    h_align, i_align = (256, 256) if sm >= 100 else (1, 32)
    return padding_bytes(expert_bytes, hidden, inter if ep > 1 else inter // tp, h_align, i_align)
