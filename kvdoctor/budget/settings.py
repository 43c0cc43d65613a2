"""The `budget:` section of a deploy file, and size strings such as "40GiB".

```yaml
budget:
  kv_budget: 40GiB          # memory left for KV caches after weights (the engines profile it on the GPU)
  # gpu_memory: 141GiB      # or: the GPU size; kvdoctor then estimates the rest from checkpoint headers
  context: 131072
  engines: [vllm, sglang, mlx-lm]
vllm: {hma: true, kv_cache_dtype: auto, tp: 1, max_num_seqs: 1024}   # each engine's own section,
sglang: {page_size: 1, swa_full_tokens_ratio: 0.8, tp_size: 2}       # shared with `check`
mlx_lm: {max_kv_size: null, kv_bits: null}
```
The engine knobs are the profiles' deploy sections (kvdoctor.deploy). Only pydantic here: the CLI
imports it for static checks.
"""
from __future__ import annotations

import re
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from kvdoctor.errors import InputError


def budget_engines() -> list[str]:
    from kvdoctor.engines import budget_engines as registered

    return registered()

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


class BudgetSettings(_Section):
    kv_budget: Optional[Union[str, int]] = Field(None, description="memory left for KV after weights, e.g. 40GiB")
    gpu_memory: Optional[Union[str, int]] = Field(None, description="GPU size, e.g. 141GiB: KV memory is estimated")
    context: Optional[int] = Field(None, ge=1, le=1 << 24)
    engines: list[str] = Field(default_factory=lambda: budget_engines())

    @field_validator("engines")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        known = budget_engines()
        for name in value:
            if name not in known:
                quoted = [repr(k) for k in known]
                raise PydanticCustomError("literal_error", f"Input should be {', '.join(quoted[:-1])} or {quoted[-1]}")
        return value

    @field_validator("kv_budget", "gpu_memory")
    @classmethod
    def _size(cls, value: Optional[Union[str, int]]) -> Optional[Union[str, int]]:
        if value is None:
            return value
        try:
            parse_size(value)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return value
