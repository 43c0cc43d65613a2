"""The deploy file's `vllm:` section: the engine arguments that change vLLM's KV caches.

Names and meanings are vLLM 0.33.0's `EngineArgs` (`--tensor-parallel-size`, `--max-model-len`, ...);
None means "not given", i.e. vLLM's own default or derivation. Strict types: `tensor_parallel_size: "8"`
is refused, as vLLM's CLI would not guess either. Imports only pydantic and kvdoctor.engines.deploy.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvdoctor.engines.budget.settings import parse_size
from kvdoctor.engines.deploy import Section
from kvdoctor.errors import InputError
from kvdoctor.load.strict import VllmBlockSize, VllmSeqs, VllmTensorParallel, VllmTokens

# vllm/config/cache.py CacheDType @ v0.33.0
CacheDType = Literal[
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SpeculativeSettings(_Strict):
    """`--speculative-config`: only what changes the KV layout (draft layers, lookahead slots)."""

    method: Literal["ngram", "eagle", "eagle3", "mtp", "draft_model", "suffix"]
    num_speculative_tokens: int = Field(ge=1, le=64)


class VllmSettings(Section):
    """One section for `check` and `budget`; defaults are vLLM's (the OpenAI server on an H200)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # The budget-only profile's spellings, still read (with a warning) and converted by `old_value`.
    OLD_NAMES: ClassVar[dict[str, str]] = {
        "tp": "tensor_parallel_size", "hma": "disable_hybrid_kv_cache_manager",
        "prefix_caching": "enable_prefix_caching", "num_speculative_tokens": "speculative_config"}

    tensor_parallel_size: VllmTensorParallel = 1
    pipeline_parallel_size: int = Field(1, ge=1, description="--pipeline-parallel-size (fit: weights and KV per stage)")
    data_parallel_size: int = Field(1, ge=1, description="--data-parallel-size (fit: replicas)")
    enable_expert_parallel: bool = Field(False, description="--enable-expert-parallel (fit: experts over TP x DP ranks)")
    gpu_memory_utilization: Optional[float] = Field(None, gt=0, le=1, description="--gpu-memory-utilization (fit)")
    enable_extensible_kv_cache: Optional[bool] = Field(
        None, description="--enable-extensible-kv-cache / --no-enable-extensible-kv-cache (vLLM 0.34.0 on; fit: false "
        "sizes the KV cache from the profiling estimate at gpu_memory_utilization 0.92); null: vLLM decides (on, CUDA)")
    enforce_eager: bool = Field(False, description="--enforce-eager: no CUDA graphs (fit subtracts none)")
    max_model_len: Optional[int] = Field(None, ge=1)
    disable_hybrid_kv_cache_manager: Optional[bool] = Field(
        None, description="true: --disable-hybrid-kv-cache-manager; false: --enable-...; null: vLLM decides")
    kv_cache_dtype: CacheDType = "auto"
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="--dtype: the weights, activations and KV cache in that dtype (fit)")
    enable_prefix_caching: Optional[bool] = None
    enable_chunked_prefill: Optional[bool] = Field(None, description="--enable-chunked-prefill / --no-enable-chunked-"
                                                   "prefill; null: vLLM decides (on)")
    block_size: Optional[VllmBlockSize] = None
    mamba_block_size: Optional[VllmBlockSize] = None
    max_num_batched_tokens: Optional[VllmTokens] = None
    max_num_seqs: Optional[VllmSeqs] = None
    kv_budget: Optional[Union[str, int]] = Field(
        None, description="KV cache memory vLLM gets after profiling, e.g. 40GiB; its admission check runs against it")
    attention_backend: Optional[str] = Field(None, description="--attention-backend, e.g. FLASH_ATTN, TRITON_ATTN")
    speculative_config: Optional[SpeculativeSettings] = None
    async_scheduling: bool = Field(True, description="--async-scheduling: two batches in flight (budget sizing)")
    cudagraph_full: bool = Field(True, description="FULL decode CUDA graphs (the default for Mamba hybrids)")
    trust_remote_code: bool = Field(False, description="--trust-remote-code: vLLM runs the configuration and "
                                    "model code the checkpoint names in auto_map (kvdoctor itself does not)")

    @classmethod
    def old_value(cls, key: str, value: Any) -> Any:
        """An old spelling's value in its new setting's terms; anything unexpected goes through
        unchanged, so that validation reports it under the old name."""
        if key == "hma" and isinstance(value, bool):
            return True if value is False else None  # hma: true was vLLM's default, not a forced flag
        if key == "num_speculative_tokens" and type(value) is int and 0 <= value <= 64:
            return {"method": "ngram", "num_speculative_tokens": value} if value else None
        return value

    @field_validator("kv_budget")
    @classmethod
    def _size(cls, value):
        if value is not None:
            try:
                parse_size(value, "vllm.kv_budget")
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def kv_budget_bytes(self) -> Optional[int]:
        return None if self.kv_budget is None else parse_size(self.kv_budget, "vllm.kv_budget")

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative_config.num_speculative_tokens if self.speculative_config else 0
