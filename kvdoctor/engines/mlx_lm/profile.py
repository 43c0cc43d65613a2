"""`mlx-lm`: mlx-lm's own generation loop and mlx_lm.server (version in kvdoctor.engines.pins): the caches
`make_prompt_cache` builds per layer and what mlx-lm's cache code refuses under the deploy section's
settings (`plan`), and the per-request caches in kvdoctor.engines.mlx_lm.budget. (`sglang-mlx` is sglang's
MLX backend over mlx-lm models.)"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pydantic import BaseModel

from kvdoctor.engines.base import Cost, DryRunner, EngineProfile, Plan, Probe
from kvdoctor.engines.mlx_lm.settings import MlxLmSettings
from kvdoctor.engines.pins import PINS

if TYPE_CHECKING:
    from kvdoctor.engines.budget.common import Budget, BudgetView
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.engines.mlx_lm.plan import MlxLmFacts
    from kvdoctor.model import ModelSpec


class CacheProbe(Probe):
    """mlx-lm's own cache objects, one per distinct layer cache, driven past the window, through
    quantization, trim and a batch merge (kvdoctor.engines.mlx_lm.probes)."""

    name = "mlx_lm_caches"

    @staticmethod
    def _groups(spec: ModelSpec, plan: Plan[object]) -> list[Any]:
        from kvdoctor.engines.mlx_lm.plan import MlxLmFacts
        from kvdoctor.engines.mlx_lm.probes import groups

        facts = plan.facts
        return groups(spec, facts.caches) if isinstance(facts, MlxLmFacts) and facts.loads else []

    def costs(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel) -> Sequence[Cost]:
        return [Cost(f"mlx-lm {g.cache.cls} for layers {list(g.layers)[:4]}", g.nbytes(), layer=g.layers[0],
                     setting="mlx_lm.max_kv_size" if g.cache.keep == 4 else None)
                for g in self._groups(spec, plan)]

    def run(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel, fits: int) -> object:
        from kvdoctor.engines.mlx_lm.probes import run_drives

        assert isinstance(settings, MlxLmSettings)
        return run_drives(self._groups(spec, plan)[:fits], settings)


class MlxLmProfile(EngineProfile):
    name = "mlx-lm"
    probe_extra = ("mlx", "its probes build mlx-lm's caches")
    dry_run_extra = "mlx"  # the dry run's child runs in kvdoctor's own Python
    pins = {"mlx-lm": PINS["mlx-lm"]}
    Settings = MlxLmSettings

    budget_setting_keys = {"kv_bits": "kv_bits", "max_kv_size": "max_kv_size"}
    refusal_codes = ("ENG001", "ENG002", "MLX102", "MLX103", "MLX133")
    shared_refusal_codes = ("MEM011",)  # checks.budget's entry: the plan reports it without a budget too

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[MlxLmFacts]:
        from kvdoctor.engines.mlx_lm.plan import plan_from

        assert isinstance(settings, MlxLmSettings)
        return plan_from(spec, settings)

    def probes(self) -> Sequence[Probe]:
        return (CacheProbe(),)

    def dry_run(self) -> DryRunner | None:
        from kvdoctor.engines.mlx_lm.dryrun import MlxLmDryRun

        return MlxLmDryRun()

    def report(self, plan: Plan[object], observations: Mapping[str, object]) -> dict[str, Any]:
        import msgspec

        from kvdoctor.engines.mlx_lm.plan import summary
        from kvdoctor.engines.mlx_lm.probes import CacheDrive

        out = summary(plan)
        drive = observations.get(CacheProbe.name)
        if isinstance(drive, CacheDrive) and "mlx_lm" in out:
            out["mlx_lm"]["probe"] = msgspec.to_builtins(drive.groups)
        return out

    def budget_facts(self, spec: ModelSpec) -> ModelFacts:
        """The config's layers, with the module mlx-lm loads for the whole config (a VLM's outer
        model_type, not its text model's): whether that class builds its own caches decides --max-kv-size."""
        from kvdoctor.engines.mlx_lm.plan import module_of

        facts = super().budget_facts(spec)
        facts.mlx_lm_module = module_of(spec)
        return facts

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
