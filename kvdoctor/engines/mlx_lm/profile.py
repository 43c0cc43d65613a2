"""`mlx-lm`: mlx-lm's own generation loop (version in kvdoctor.engines.pins). The budget half only: the
per-request caches in kvdoctor.engines.mlx_lm.budget. (`sglang-mlx` is sglang's MLX backend over mlx-lm models.)"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from pydantic import BaseModel

from kvdoctor.load.strict import MlxGroupSize, MlxKvBits, NonNegative, Tokens
from kvdoctor.engines.deploy import Section
from kvdoctor.engines.base import EngineProfile
from kvdoctor.engines.pins import PINS

if TYPE_CHECKING:
    from kvdoctor.engines.budget.common import Budget
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings


class MlxLmSettings(Section):
    """mlx-lm's knobs (mlx_lm.generate / server defaults)."""

    max_kv_size: Optional[Tokens] = None
    kv_bits: Optional[MlxKvBits] = None
    kv_group_size: MlxGroupSize = 64
    quantized_kv_start: NonNegative = 5000
    prefill_step_size: Tokens = 2048


class MlxLmProfile(EngineProfile):
    name = "mlx-lm"
    pins = {"mlx-lm": PINS["mlx-lm"]}
    Settings = MlxLmSettings

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[list[Budget], dict[str, Any]]:
        from kvdoctor.engines.mlx_lm.budget import budgets

        assert isinstance(settings, MlxLmSettings)
        return budgets(facts, dict(config), settings, inputs, all_modes)
