"""`vllm`: vLLM (v1 engine, CUDA; version in kvdoctor.engines.pins). For now the budget half only: the
KV pool sizing model in kvdoctor.budget.vllm, with this profile's deploy section."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from pydantic import BaseModel, Field

from kvdoctor.strict import (Bool, Name, SpeculativeTokens, VllmBlockSize, VllmSeqs, VllmTensorParallel,
                              VllmTokens)
from kvdoctor.deploy import Section
from kvdoctor.engines.base import EngineProfile
from kvdoctor.engines.pins import PINS

if TYPE_CHECKING:
    from kvdoctor.budget.common import Budget
    from kvdoctor.budget.facts import ModelFacts
    from kvdoctor.budget.settings import BudgetSettings


class VllmSettings(Section):
    """vLLM's knobs; defaults are the OpenAI server's on an H200."""

    hma: Bool = Field(True, description="the hybrid KV cache manager (false: --disable-hybrid-kv-cache-manager)")
    kv_cache_dtype: Name = "auto"
    tp: VllmTensorParallel = 1
    prefix_caching: Bool = True
    num_speculative_tokens: SpeculativeTokens = 0
    max_num_batched_tokens: VllmTokens = 8192
    async_scheduling: Bool = True
    max_num_seqs: VllmSeqs = 1024
    block_size: Optional[VllmBlockSize] = None
    cudagraph_full: Bool = Field(True, description="FULL decode CUDA graphs (the default for Mamba hybrids)")


class VllmProfile(EngineProfile):
    name = "vllm"
    pins = {"vllm": PINS["vllm"]}
    Settings = VllmSettings

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[list[Budget], dict[str, Any]]:
        from kvdoctor.budget.run import vllm_budgets

        assert isinstance(settings, VllmSettings)
        return vllm_budgets(facts, settings, inputs, all_modes)
