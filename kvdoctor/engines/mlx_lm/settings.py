"""The deploy file's `mlx_lm:` section: mlx-lm's generation and server knobs that size its caches."""
from __future__ import annotations

from typing import Optional

from kvdoctor.engines.deploy import Section
from kvdoctor.load.strict import MlxGroupSize, MlxKvBits, NonNegative, Tokens


class MlxLmSettings(Section):
    """mlx-lm's knobs (mlx_lm.generate / server defaults)."""

    max_kv_size: Optional[Tokens] = None
    kv_bits: Optional[MlxKvBits] = None
    kv_group_size: MlxGroupSize = 64
    quantized_kv_start: NonNegative = 5000
    prefill_step_size: Tokens = 2048
