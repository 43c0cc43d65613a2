"""The `budget:` section of a deploy file, and size strings such as "40GiB".

```yaml
budget:
  kv_budget: 40GiB          # memory left for KV caches after weights (the engines profile it on the GPU)
  # gpu_memory: 141GiB      # or: the GPU size; kvdoctor then estimates the rest from checkpoint headers
  context: 131072
  vllm: {hma: true, kv_cache_dtype: auto, tp: 1, max_num_seqs: 1024}
  sglang: {page_size: 1, swa_full_tokens_ratio: 0.8}
  mlx_lm: {max_kv_size: null, kv_bits: null}
```
Only pydantic here: the CLI imports it for static checks.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from kvdoctor.strict import (Bool, MlxGroupSize, MlxKvBits, Name, NonNegative, Positive, PositiveFloat, Size,
                             SglangSwaRatio, SpeculativeTokens, TensorParallel, Tokens, VllmBlockSize, VllmSeqs,
                             VllmTensorParallel, VllmTokens, parse_size)

__all__ = ["BudgetSettings", "parse_size"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmBudget(_Section):
    """vLLM 0.33.0 knobs; defaults are the OpenAI server's on an H200."""

    hma: Bool = Field(True, description="the hybrid KV cache manager (false: --disable-hybrid-kv-cache-manager)")
    kv_cache_dtype: Name = "auto"
    tp: VllmTensorParallel = 1
    prefix_caching: Bool = True
    num_speculative_tokens: SpeculativeTokens = 0
    max_num_batched_tokens: VllmTokens = 8192
    async_scheduling: Bool = True
    max_num_seqs: VllmSeqs = 1024
    block_size: Optional[VllmBlockSize] = None
    cudagraph_full: Bool = Field(True, description="FULL decode CUDA graphs (the default for Mamba hybrids)")


class SglangBudget(_Section):
    """SGLang 0.5.23 knobs; page_size is whatever the attention backend resolves to."""

    page_size: Positive = 1
    swa_full_tokens_ratio: SglangSwaRatio = 0.8
    disable_hybrid_swa_memory: Bool = False
    kv_cache_dtype: Name = "auto"
    tp: TensorParallel = 1
    max_mamba_cache_size: Optional[NonNegative] = None
    mamba_full_memory_ratio: PositiveFloat = 0.9
    mamba_ssm_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    radix_cache: Bool = True
    max_running_requests: Optional[Positive] = None
    max_total_tokens: Optional[Positive] = None
    chunked_prefill_size: Tokens = 8192


class MlxBudget(_Section):
    """mlx-lm 0.32.2 knobs."""

    max_kv_size: Optional[Tokens] = None
    kv_bits: Optional[MlxKvBits] = None
    kv_group_size: MlxGroupSize = 64
    quantized_kv_start: NonNegative = 5000
    prefill_step_size: Tokens = 2048


class BudgetSettings(_Section):
    kv_budget: Optional[Size] = Field(None, description="memory left for KV after weights, e.g. 40GiB")
    gpu_memory: Optional[Size] = Field(None, description="GPU size, e.g. 141GiB: KV memory is estimated")
    context: Optional[Tokens] = None
    engines: list[Literal["vllm", "sglang", "mlx-lm"]] = Field(default_factory=lambda: ["vllm", "sglang", "mlx-lm"])
    vllm: VllmBudget = Field(default_factory=VllmBudget)
    sglang: SglangBudget = Field(default_factory=SglangBudget)
    mlx_lm: MlxBudget = Field(default_factory=MlxBudget)

