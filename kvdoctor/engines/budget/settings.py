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
The engine knobs are the profiles' deploy sections (kvdoctor.engines.deploy). Only pydantic here: the CLI
imports it for static checks.
"""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from kvdoctor.load.strict import Size, Tokens, parse_size

__all__ = ["BudgetSettings", "parse_size"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetSettings(_Section):
    kv_budget: Optional[Size] = Field(None, description="memory left for KV after weights, e.g. 40GiB")
    gpu_memory: Optional[Size] = Field(None, description="GPU size, e.g. 141GiB: KV memory is estimated")
    context: Optional[Tokens] = None
    # What `fit` and check's deploy gate read: the GPU (a preset of kvdoctor/data/gpus.json), how many, and the
    # requests at `context` served at once.
    gpu: Optional[str] = Field(None, description="GPU preset, e.g. H100-80GB (kvdoctor fit --gpu)")
    gpus: Optional[int] = Field(None, ge=1, description="GPUs of the deployment")
    concurrency: Optional[int] = Field(None, ge=1, description="requests at `context` served at once")
    # None: every engine with a budget model. The names a file may give come from the registry, in the
    # validation context (kvdoctor.engines.deploy passes them), so this module needs no registry.
    engines: Optional[list[str]] = None

    @field_validator("engines")
    @classmethod
    def _known(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        known: list[str] = (info.context or {}).get("budget_engines") or []
        for name in value if known and value else ():
            if name not in known:
                quoted = [repr(k) for k in known]
                raise PydanticCustomError("literal_error", f"Input should be {', '.join(quoted[:-1])} or {quoted[-1]}")
        return value
