"""`vllm`: vLLM (v1 engine, CUDA; version in kvdoctor.engines.pins). For now the budget half only: the
KV pool sizing model in kvdoctor.budget.vllm, with this profile's deploy section."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from pydantic import BaseModel, Field

from kvdoctor.deploy import Section
from kvdoctor.engines.base import EngineProfile
from kvdoctor.engines.pins import PINS

if TYPE_CHECKING:
    from kvdoctor.budget.common import Budget
    from kvdoctor.budget.facts import ModelFacts
    from kvdoctor.budget.settings import BudgetSettings


class VllmSettings(Section):
    """vLLM's knobs; defaults are the OpenAI server's on an H200."""

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


class VllmProfile(EngineProfile):
    name = "vllm"
    pins = {"vllm": PINS["vllm"]}
    Settings = VllmSettings

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[list[Budget], dict[str, Any]]:
        from kvdoctor.budget.run import vllm_budgets

        assert isinstance(settings, VllmSettings)
        return vllm_budgets(facts, settings, inputs, all_modes)
