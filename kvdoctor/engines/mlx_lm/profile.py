"""`mlx-lm`: mlx-lm's own generation loop and mlx_lm.server (version in kvdoctor.engines.pins): the caches
`make_prompt_cache` builds per layer and what mlx-lm's cache code refuses under the deploy section's
settings (`plan`), and the per-request caches in kvdoctor.engines.mlx_lm.budget. (`sglang-mlx` is sglang's
MLX backend over mlx-lm models.)"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pydantic import BaseModel

from kvdoctor.engines.base import EngineProfile, Plan
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.engines.pins import PINS

if TYPE_CHECKING:
    from kvdoctor.engines.budget.common import Budget, BudgetView
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.mlx_lm.plan import MlxLmFacts
    from kvdoctor.model import ModelSpec


class MlxLmProfile(EngineProfile):
    name = "mlx-lm"
    pins = {"mlx-lm": PINS["mlx-lm"]}
    Settings = MlxLmSettings

    budget_setting_keys = {"kv_bits": "kv_bits", "max_kv_size": "max_kv_size"}
    refusal_codes = ("ENG001", "ENG002", "MLX102", "MLX103")
    shared_refusal_codes = ("MEM011",)  # checks.budget's entry: the plan reports it without a budget too

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[MlxLmFacts]:
        from kvdoctor.engines.mlx_lm.plan import plan_from

        assert isinstance(settings, MlxLmSettings)
        return plan_from(spec, settings)

    def report(self, plan: Plan[object], observations: Mapping[str, object]) -> dict[str, Any]:
        from kvdoctor.engines.mlx_lm.plan import summary

        return summary(plan)

    def budget_view(self, row: Mapping[str, Any]) -> BudgetView:
        from kvdoctor.engines.mlx_lm.budget import view

        return view(dict(row))

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[Sequence[Budget], dict[str, Any]]:
        from kvdoctor.engines.mlx_lm.budget import budgets

        assert isinstance(settings, MlxLmSettings)
        return budgets(facts, dict(config), settings, inputs, all_modes)
