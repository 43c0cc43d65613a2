"""Deploy settings (`--deploy deploy.yaml`): what the engine will be started with.

Unknown keys and wrong types are refused with the file, line and field; YAML tags that would build
objects are refused by the safe loader. Every setting has the engine's own default.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from kvdoctor.budget.settings import BudgetSettings
from kvdoctor.model import Source
from kvdoctor.strict import (Bool, Name, NonNegative, Positive, SglangReplayCacheLen, TensorParallel,
                              Tokens)
from kvdoctor.yamlfile import load_validated

MAX_DEPLOY_BYTES = 1024 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SglangMlxSettings(_Section):
    """sglang 0.5.23's MLX backend (server defaults)."""

    chunked_prefill_size: Tokens = 8192
    radix_cache: Bool = True
    use_custom_rope: Bool = Field(False, description="SGLANG_MLX_USE_CUSTOM_ROPE=1")
    pool_size: Optional[Positive] = Field(None, description="pool slots; None: sized by the runner")
    full_kv_pool_index_by_layer: Optional[dict[NonNegative, NonNegative]] = Field(
        None, description="a map to check instead of the one the layout derives")


class SglangSettings(_Section):
    """sglang 0.5.23 on CUDA: the KDA / ReplaySSM state caches."""

    tp_size: Optional[TensorParallel] = Field(None, description="attention tensor-parallel size; None: check 1, 2, 4, 8")
    enable_linear_replayssm: Bool = False
    linear_replayssm_cache_len: SglangReplayCacheLen = Field(16, description="--linear-replayssm-cache-len")
    linear_attn_decode_backend: Literal["triton", "helion", "flashinfer", "cutedsl"] = "triton"
    max_mamba_cache_size: Optional[NonNegative] = None
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    kda_recipe: Name = Field("sglang-0.5.23", description="a built-in recipe name or a recipe YAML path")


class Deploy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: Optional[Name] = None
    context_length: Optional[Tokens] = None
    sglang_mlx: SglangMlxSettings = Field(default_factory=SglangMlxSettings)
    sglang: SglangSettings = Field(default_factory=SglangSettings)
    budget: Optional[BudgetSettings] = None
    path: Optional[str] = Field(None, exclude=True)
    lines: dict[str, int] = Field(default_factory=dict, exclude=True)

    def source(self, dotted: str) -> Source:
        """Where a setting came from: its line in the deploy file, or the engine default."""
        if self.path and dotted in self.lines:
            return Source("deploy", dotted, self.path, self.lines[dotted])
        return Source("default", dotted)


def load_deploy(path: str | None) -> Deploy:
    if path is None:
        return Deploy()
    deploy, lines = load_validated(Path(path), Deploy, "deploy file", MAX_DEPLOY_BYTES, field_word="setting",
                                   empty=True)
    deploy.path, deploy.lines = path, lines
    return deploy
