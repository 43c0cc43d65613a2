"""The `sglang:` deploy-file keys this profile reads, named exactly as SGLang 0.5.23's `ServerArgs` fields.

None means "SGLang's own default", resolved the way its start-up resolves it on an H200 (see
`resolved_page_size` and the other helpers here). `kv_budget` is kvdoctor's own key: the KV memory SGLang
gets after profiling (e.g. `40GiB`); `budget` reads the same section.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from kvdoctor.engines.deploy import Section
from kvdoctor.engines.pins import PINS
from kvdoctor.load.strict import (Bool, Name, NonNegative, Positive, PositiveFloat, SglangReplayCacheLen,
                                  SglangSwaRatio, TensorParallel, Tokens, size_bytes)

# The keys of the section that SGLang's ServerArgs reads under the same name (the rest is kvdoctor's own).
SERVER_ARGS = ("tp_size", "context_length", "page_size", "kv_cache_dtype", "disable_hybrid_swa_memory",
               "swa_full_tokens_ratio", "mamba_ssm_dtype", "max_running_requests", "max_mamba_cache_size",
               "attention_backend", "disable_overlap_schedule", "speculative_algorithm", "speculative_num_draft_tokens")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16", "mxfp8", "nvfp4", "fp4_mx_block16")
SSM_DTYPES = ("float32", "bfloat16", "float16")


KDA_RECIPE_DEFAULT = "sglang-" + PINS["sglang"]


class SglangSettings(Section):
    """The `sglang:` section, read by every part of the profile (the pool plan, the KDA / ReplaySSM state
    caches, the budget, the dry run): SGLang's server defaults where a key is not given."""

    tp_size: Optional[TensorParallel] = Field(None, description="--tp-size; None: sglang's 1 for the budget, "
                                                                    "and the KDA checks try 1, 2, 4 and 8")
    pp_size: Positive = Field(1, description="--pp-size (fit: weights and KV per stage)")
    dp_size: Positive = Field(1, description="--dp-size (fit: replicas, or attention DP ranks)")
    enable_dp_attention: Bool = Field(False, description="--enable-dp-attention (fit: attention over tp/dp ranks)")
    ep_size: Positive = Field(1, description="--ep-size (fit: experts over this many ranks)")
    mem_fraction_static: Optional[PositiveFloat] = Field(None, description="--mem-fraction-static (fit)")
    enable_linear_replayssm: Bool = False
    linear_replayssm_cache_len: SglangReplayCacheLen = Field(16, description="--linear-replayssm-cache-len")
    linear_attn_decode_backend: Literal["triton", "helion", "flashinfer", "cutedsl"] = "triton"
    max_mamba_cache_size: Optional[NonNegative] = None
    mamba_ssm_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="--mamba-ssm-dtype; None: the config's (GDN models), else float32")
    kda_recipe: Name = Field(KDA_RECIPE_DEFAULT, description="a built-in recipe name or a recipe YAML path")
    page_size: Optional[Positive] = Field(None, description="--page-size; None: what the attention backend "
                                                            "resolves (FA3: 1; DSA: 64 per index pool)")
    swa_full_tokens_ratio: SglangSwaRatio = 0.8
    disable_hybrid_swa_memory: Bool = False
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "auto"  # type: ignore[valid-type]
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="--dtype: the weights and KV cache in that dtype (fit)")
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
    kv_budget: Optional[int] = Field(
        None, description="the KV memory SGLang gets after profiling (e.g. 40GiB): sizes info.sglang.budget")

    @field_validator("kv_budget", mode="before")
    @classmethod
    def _kv_bytes(cls, value: Any) -> int | None:
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

    @property
    def tp(self) -> int:
        return self.tp_size or 1

    def server_args(self) -> dict[str, Any]:
        """The keys that are ServerArgs fields, under ServerArgs' names (`radix_cache` is its
        `disable_radix_cache`, negated), without those left to SGLang's default (None)."""
        args = {k: v for k, v in self.model_dump(include=set(SERVER_ARGS)).items() if v is not None}
        return {**args, "disable_radix_cache": not self.radix_cache}

    @property
    def ssm_dtype(self) -> str:
        """The KDA state dtype: sglang keeps KDA state in float32 unless --mamba-ssm-dtype says otherwise."""
        return self.mamba_ssm_dtype or "float32"
