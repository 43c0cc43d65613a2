"""The `sglang:` deploy-file keys this profile reads, named exactly as SGLang 0.5.23's `ServerArgs` fields.

None means "SGLang's own default", resolved the way its start-up resolves it on an H200 (see
`resolved_page_size` and the other helpers here). `kv_budget` is kvdoctor's own key: the KV memory SGLang
gets after profiling (e.g. `40GiB`); `budget` reads the same section.
"""
from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16", "mxfp8", "nvfp4", "fp4_mx_block16")
SSM_DTYPES = ("float32", "bfloat16", "float16")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_bytes(value: int | str) -> int:
    """`40GiB`, `512 MiB`, `1e9`-free plain integers: bytes. Raises ValueError on anything else."""
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"not a size: {value!r} (write e.g. 40GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


class Settings(BaseModel):
    """What changes SGLang's pools, windows and start-up checks for one model."""

    model_config = ConfigDict(extra="ignore")  # the section also holds the KDA keys of the existing profile

    tp_size: Optional[int] = Field(None, ge=1)
    context_length: Optional[int] = Field(None, ge=1)
    page_size: Optional[int] = Field(None, ge=1)
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "auto"  # type: ignore[valid-type]
    disable_hybrid_swa_memory: bool = False
    swa_full_tokens_ratio: float = Field(0.8, gt=0)
    mamba_ssm_dtype: Optional[Literal[SSM_DTYPES]] = None  # type: ignore[valid-type]
    max_running_requests: Optional[int] = Field(None, ge=1)
    max_mamba_cache_size: Optional[int] = Field(None, ge=0)
    attention_backend: Optional[str] = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    speculative_algorithm: Optional[str] = None
    speculative_num_draft_tokens: Optional[int] = Field(None, ge=1)
    kv_budget: Optional[int] = None

    @field_validator("kv_budget", mode="before")
    @classmethod
    def _bytes(cls, value):
        return None if value is None else parse_bytes(value)

    @property
    def tp(self) -> int:
        return self.tp_size or 1
