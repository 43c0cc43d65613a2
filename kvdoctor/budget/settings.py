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

import re
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvdoctor.errors import InputError

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
         "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
MAX_BYTES = 1 << 50


def parse_size(value: Union[str, int, float], what: str = "size") -> int:
    """'40GiB', '80 GB', '1.5TiB' or a plain byte count -> bytes."""
    if isinstance(value, bool):
        raise InputError(f"{what}: expected a size such as 40GiB, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = SIZE_RE.match(str(value))
        if not match or match.group(2).lower() not in UNITS:
            raise InputError(f"{what}: expected a size such as 40GiB or 80GB, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * UNITS[unit])
    if not 0 < size <= MAX_BYTES:
        raise InputError(f"{what}: {value!r} is out of range; expected more than 0 and at most 1 PiB")
    return size


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VllmBudget(_Section):
    """vLLM 0.33.0 knobs; defaults are the OpenAI server's on an H200."""

    hma: bool = Field(True, description="the hybrid KV cache manager (false: --disable-hybrid-kv-cache-manager)")
    kv_cache_dtype: str = "auto"
    tp: int = Field(1, ge=1, le=1024)
    prefix_caching: bool = True
    num_speculative_tokens: int = Field(0, ge=0, le=64)
    max_num_batched_tokens: int = Field(8192, ge=1)
    async_scheduling: bool = True
    max_num_seqs: int = Field(1024, ge=1)
    block_size: Optional[int] = Field(None, ge=1)
    cudagraph_full: bool = Field(True, description="FULL decode CUDA graphs (the default for Mamba hybrids)")


class SglangBudget(_Section):
    """SGLang 0.5.23 knobs; page_size is whatever the attention backend resolves to."""

    page_size: int = Field(1, ge=1)
    swa_full_tokens_ratio: float = Field(0.8, gt=0, le=1)
    disable_hybrid_swa_memory: bool = False
    kv_cache_dtype: str = "auto"
    tp: int = Field(1, ge=1, le=1024)
    max_mamba_cache_size: Optional[int] = Field(None, ge=0)
    mamba_full_memory_ratio: float = Field(0.9, gt=0)
    mamba_ssm_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    radix_cache: bool = True
    max_running_requests: Optional[int] = Field(None, ge=1)
    max_total_tokens: Optional[int] = Field(None, ge=1)
    chunked_prefill_size: int = Field(8192, ge=1)


class MlxBudget(_Section):
    """mlx-lm 0.32.2 knobs."""

    max_kv_size: Optional[int] = Field(None, ge=1)
    kv_bits: Optional[int] = Field(None, ge=1, le=8)
    kv_group_size: int = Field(64, ge=1)
    quantized_kv_start: int = Field(5000, ge=0)
    prefill_step_size: int = Field(2048, ge=1)


class BudgetSettings(_Section):
    kv_budget: Optional[Union[str, int]] = Field(None, description="memory left for KV after weights, e.g. 40GiB")
    gpu_memory: Optional[Union[str, int]] = Field(None, description="GPU size, e.g. 141GiB: KV memory is estimated")
    context: Optional[int] = Field(None, ge=1, le=1 << 24)
    engines: list[Literal["vllm", "sglang", "mlx-lm"]] = Field(default_factory=lambda: ["vllm", "sglang", "mlx-lm"])
    vllm: VllmBudget = Field(default_factory=VllmBudget)
    sglang: SglangBudget = Field(default_factory=SglangBudget)
    mlx_lm: MlxBudget = Field(default_factory=MlxBudget)

    @field_validator("kv_budget", "gpu_memory")
    @classmethod
    def _size(cls, value):
        if value is None:
            return value
        try:
            parse_size(value)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return value
