"""The deploy file's `mlx_lm:` section: mlx-lm's generation and server knobs that size its caches and
decide which of its cache paths a request takes (quantization, batching, prompt-cache reuse, drafts)."""
from __future__ import annotations

from typing import Optional

from pydantic import Field

from kvdoctor.engines.deploy import Section
from kvdoctor.load.strict import Bool, MlxGroupSize, MlxKvBits, Name, NonNegative, Size, Tokens


class MlxLmSettings(Section):
    """mlx-lm's knobs (mlx_lm.generate / mlx_lm.server defaults at the pinned release)."""

    max_kv_size: Optional[Tokens] = None
    kv_bits: Optional[MlxKvBits] = None
    kv_group_size: MlxGroupSize = 64
    quantized_kv_start: NonNegative = 5000
    prefill_step_size: Tokens = 2048
    batch_generate: Bool = Field(False, description=(
        "requests go through mlx-lm's BatchGenerator directly (batch_generate, or a server built on it); "
        "False: mlx_lm.server, which serves a model one request at a time when its caches cannot merge"))
    prompt_cache_size: NonNegative = Field(10, description="mlx_lm.server --prompt-cache-size (0: no reuse)")
    draft_model: Optional[Name] = Field(None, description="--draft-model: speculative decoding")
    working_set: Optional[Size] = Field(None, description=(
        "Metal's recommended working set on the machine, mx.device_info()['max_recommended_working_set_size'] "
        "(follows sysctl iogpu.wired_limit_mb); None: the GPU preset's figure (kvdoctor fit)"))
