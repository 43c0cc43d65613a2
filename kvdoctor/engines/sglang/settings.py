"""The `sglang:` deploy-file keys this profile reads, named exactly as SGLang 0.5.23's `ServerArgs` fields.

None means "SGLang's own default", resolved the way its start-up resolves it on an H200 (see
`resolved_page_size` and the other helpers here). `kv_budget` is kvdoctor's own key: the KV memory SGLang
gets after profiling (e.g. `40GiB`); `budget` reads the same section.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator

from kvdoctor.engines.deploy import Section
from kvdoctor.engines.pins import PINS
from kvdoctor.errors import InputError
from kvdoctor.load.strict import (Bool, Name, NonNegative, Positive, PositiveFloat, SglangReplayCacheLen,
                                  SglangSwaRatio, TensorParallel, Tokens, size_bytes)

KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16", "mxfp8", "nvfp4", "fp4_mx_block16")
SSM_DTYPES = ("float32", "bfloat16", "float16")


class Settings(BaseModel):
    """What changes SGLang's pools, windows and start-up checks for one model."""

    model_config = ConfigDict(extra="ignore")  # the section also holds the KDA keys of the existing profile
    _release: Optional[str] = PrivateAttr(None)  # the SGLang release described (the section's); None: the pinned one

    @property
    def release(self) -> Optional[str]:
        return self._release

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
        return None if value is None else size_bytes(value)

    @property
    def tp(self) -> int:
        return self.tp_size or 1


# The profile's deploy section, with kvdoctor's strict types; `cuda()` gives the CUDA plan's `Settings`.
KDA_RECIPE_DEFAULT = "sglang-" + PINS["sglang"]


class SglangSettings(Section):
    """sglang on CUDA (server defaults): the KDA / ReplaySSM state caches and the memory pools."""

    tp_size: Optional[TensorParallel] = Field(None, description="--tp-size; None: sglang's 1 for the budget, "
                                                                    "and the KDA checks try 1, 2, 4 and 8")
    enable_linear_replayssm: Bool = False
    linear_replayssm_cache_len: SglangReplayCacheLen = Field(16, description="--linear-replayssm-cache-len")
    linear_attn_decode_backend: Literal["triton", "helion", "flashinfer", "cutedsl"] = "triton"
    max_mamba_cache_size: Optional[NonNegative] = None
    mamba_ssm_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="--mamba-ssm-dtype; None: the config's (GDN models), else float32")
    kda_recipe: Name = Field(KDA_RECIPE_DEFAULT, description="a built-in recipe name or a recipe YAML path")
    page_size: Positive = Field(1, description="whatever the attention backend resolves to")
    swa_full_tokens_ratio: SglangSwaRatio = 0.8
    disable_hybrid_swa_memory: Bool = False
    kv_cache_dtype: Name = "auto"
    mamba_full_memory_ratio: PositiveFloat = 0.9
    radix_cache: Bool = True
    max_running_requests: Optional[Positive] = None
    max_total_tokens: Optional[Positive] = None
    chunked_prefill_size: Tokens = 8192
    # The CUDA pool plan's knobs (kvdoctor.engines.sglang.layout), named as ServerArgs names them.
    context_length: Optional[Tokens] = Field(None, description="--context-length; None: the config's derived one")
    attention_backend: Optional[Name] = None
    disable_overlap_schedule: Bool = False
    speculative_algorithm: Optional[Name] = None
    speculative_num_draft_tokens: Optional[Positive] = None
    kv_budget: Optional[Union[Positive, Name]] = Field(
        None, description="the KV memory SGLang gets after profiling (e.g. 40GiB): sizes info.sglang.budget")

    @field_validator("kv_budget")
    @classmethod
    def _kv_bytes(cls, value: int | str | None) -> int | None:
        return None if value is None else size_bytes(value)

    @field_validator("kda_recipe")
    @classmethod
    def _relative_to_deploy_file(cls, value: str, info: ValidationInfo) -> str:
        """A recipe path in a deploy file is relative to that file's directory."""
        base = (info.context or {}).get("deploy_dir")
        is_path = "/" in value or value.endswith((".yaml", ".yml"))
        if base is not None and is_path and not Path(value).is_absolute():
            return str(Path(base) / value)
        return value

    def cuda(self) -> Settings:
        """The keys the CUDA pool plan reads (`radix_cache` is ServerArgs' `disable_radix_cache`, negated)."""
        fields = set(Settings.model_fields) - {"disable_radix_cache"}
        values = {k: v for k, v in self.model_dump().items() if k in fields}
        try:
            cuda = Settings(**values, disable_radix_cache=not self.radix_cache)
            cuda._release = self.release
            return cuda
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise InputError(f"setting 'sglang.{where}': {error['msg']} (got {error.get('input')!r})") from None

    @property
    def ssm_dtype(self) -> str:
        """The KDA state dtype: sglang keeps KDA state in float32 unless --mamba-ssm-dtype says otherwise."""
        return self.mamba_ssm_dtype or "float32"
