"""`mlx-lm`: mlx-lm's own generation loop (version in kvdoctor.engines.pins). The budget half only: the
per-request caches in kvdoctor.engines.mlx_lm.budget. (`sglang-mlx` is sglang's MLX backend over mlx-lm models.)"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pydantic import BaseModel

from kvdoctor.engines.base import EngineProfile
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.engines.pins import PINS

if TYPE_CHECKING:
    from kvdoctor.engines.budget.common import Budget, BudgetView
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.model import ModelSpec


class MlxLmProfile(EngineProfile):
    name = "mlx-lm"
    pins = {"mlx-lm": PINS["mlx-lm"]}
    Settings = MlxLmSettings

    budget_setting_keys = {"kv_bits": "kv_bits", "max_kv_size": "max_kv_size"}

    def budget_view(self, row: Mapping[str, Any]) -> BudgetView:
        from kvdoctor.engines.mlx_lm.budget import view

        return view(dict(row))

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[Sequence[Budget], dict[str, Any]]:
        from kvdoctor.engines.mlx_lm.budget import budgets

        assert isinstance(settings, MlxLmSettings)
        return budgets(facts, dict(config), settings, inputs, all_modes)

    def fit(self, spec: ModelSpec, facts: ModelFacts, gpu: Any, layout: Mapping[str, Any], request: Any,
            settings: Mapping[str, Any]) -> Any:
        from kvdoctor.engines.mlx_lm import fit as fit_mlx

        return fit_mlx.fit(spec, facts, gpu, dict(layout), request, dict(settings))

    def fit_layouts(self, facts: ModelFacts, config: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
        from kvdoctor.engines.mlx_lm import fit as fit_mlx

        return fit_mlx.layouts(facts, dict(config), gpus)
