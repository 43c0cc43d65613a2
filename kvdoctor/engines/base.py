"""The seam every engine profile implements, and the typed, frozen plan it returns.

Data flows one way: load -> `EngineProfile.plan` (static, no torch / mlx) -> the probes the selected
rules need (`EngineProfile.probes`, each sized before it builds anything) -> rules (read spec, plan and
observations; return findings) -> `EngineProfile.report` for the JSON `info`. Nothing downstream writes
into a plan; a probe returns observations, never catalog codes.

Refinements of the first contract, all additive (every earlier name and field keeps its meaning):
- `Refusal` gained `explanation`, `where`, `setting`, `severity` and `latent`, so that one generic rule
  (`kvdoctor.checks.refusals`) can turn any profile's predicted refusals into findings with the same
  text and location the per-code branches gave.
- `plan`, `budget` and `dry_run` are optional overrides rather than abstract: a profile may exist for
  one purpose (the mlx-lm profile only sizes budgets). The registry offers a profile to `check` when
  it overrides `plan`, to `budget` when it overrides `budget`, and to `--dry-run` when `dry_run()`
  returns a runner.
- `Probe` and `Cost` state the probe stage: a probe lists what it will build, in order, before it
  builds anything; the pipeline turns the first entry past the budget into LIM001.
- The version pins are read from `kvdoctor.engines.pins` (two profiles pin the same sglang release).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Mapping, Sequence, TypeVar

import msgspec

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kvdoctor.engines.budget.common import Budget, BudgetView
    from kvdoctor.engines.budget.facts import ModelFacts
    from kvdoctor.engines.budget.settings import BudgetSettings
    from kvdoctor.model import ModelSpec, Source

STAGES = ("load", "startup", "prefill", "decode")


class Refusal(msgspec.Struct, frozen=True):
    """An error the engine will raise for this model and these settings, predicted without running it."""

    code: str  # the catalog entry that explains it
    error_class: str  # the exception class, as the engine names it
    message: str  # the exact text the engine prints, numbers filled in
    stage: str  # one of STAGES
    layer: int | None = None
    key: str | None = None  # the config key at fault, for location and fingerprint
    source: str | None = None  # where the engine raises it: a pinned source URL or file:line @ version
    evidence: Mapping[str, Any] = msgspec.field(default_factory=dict)
    explanation: str = ""  # the finding's text, in kvdoctor's words; empty: the engine's message
    where: Source | None = None  # the location when it is not a config key (a checkpoint tensor)
    setting: str | None = None  # a deploy-file setting at fault (dotted: "sglang.tp_size"); beats `key`
    severity: str | None = None  # None: the catalog entry's
    latent: bool = False  # raised only once another setting changes: reported without engine_error

    def engine_error(self) -> dict[str, Any] | None:
        if self.latent:
            return None
        return {"class": self.error_class, "message": self.message, "stage": self.stage}


class LayerPlan(msgspec.Struct, frozen=True):
    """What one engine will do with one layer."""

    index: int
    engine_window: int | None  # keys attended including the query's own (the `window` convention); None: full
    cache: str | None  # kvdoctor's label for the cache the engine builds: full, windowed, mla, state, ...
    state: Mapping[str, Any] | None = None  # recurrent-state shapes and bytes, by TP size
    extra: Mapping[str, Any] = msgspec.field(default_factory=dict)  # engine-specific JSON fields: engine_spec, pool_index


FactsT = TypeVar("FactsT", covariant=True)


class Plan(msgspec.Struct, Generic[FactsT], frozen=True):
    engine: str
    versions: Mapping[str, str]
    layers: tuple[LayerPlan, ...]
    refusals: tuple[Refusal, ...] = ()
    facts: FactsT | None = None  # a frozen record (msgspec Struct) of the profile's own: pools, groups, fused kernels
    notes: tuple[str, ...] = ()


class Cost(msgspec.Struct, frozen=True):
    """Caches a probe is about to build: what they are, their bytes, and the value that made them big."""

    what: str
    nbytes: int
    source: Source | None = None
    layer: int | None = None
    setting: str | None = None  # a deploy-file setting that sized them (located by the pipeline); beats `source`


class Probe(ABC):
    """Builds and drives real caches for one engine and returns what it observed (data, never codes)."""

    name: ClassVar[str]  # what a rule names in `needs` as "probe:<name>"

    def costs(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel) -> Sequence[Cost]:
        """What `run` builds, in order, one entry per unit of work; nothing is built yet."""
        return ()

    @abstractmethod
    def run(self, spec: ModelSpec, plan: Plan[object], settings: BaseModel, fits: int) -> object:
        """Run the first `fits` units listed by `costs` (the ones within the budget) and observe."""


class DryRunError(msgspec.Struct, frozen=True, omit_defaults=True, rename={"cls": "class"}):
    """The exception the engine's own code raised in a dry run, and where."""

    cls: str
    message: str
    stage: str  # the engine's step (config, specs, sizing, ...) or one of STAGES
    frame: str | None = None  # file:line (in function) in the engine's code, where it can tell
    layer: int | None = None  # the layer running when it raised
    copy: str | None = None  # the shrunk copy of the model it ran on, where the dry run shrinks


# A dry run's outcome: the engine's code ran to the end (clean), raised (error), the dry run declined a
# step it cannot run faithfully (refused), was stopped at its time bound (timeout), or its process ended
# without saying why (crashed); or it never ran (unavailable).
DRY_RUN_OUTCOMES = ("clean", "error", "refused", "timeout", "crashed", "unavailable")


class DryRun(msgspec.Struct, kw_only=True):
    """What one engine's own code did on a weightless copy of the model: the same record for every engine.
    Data only: the dry-run rules judge it, the reports show it (`to_json`, `summary`)."""

    engine: str
    outcome: str  # one of DRY_RUN_OUTCOMES
    reason: str | None = None  # why it did not run (unavailable) or did not finish (timeout, crashed)
    versions: Mapping[str, str] = {}
    stages: Mapping[str, str] = {}  # stage -> ok | error | stopped | not run, in the order they run
    error: DryRunError | None = None
    seconds: float | None = None
    layers: Sequence[Mapping[str, Any]] = ()  # what the engine built or attended, per layer
    compared: Sequence[str] = ()  # what the engine's answer was held against the plan on (empty: its rule does it)
    differences: Sequence[str] = ()  # where the static plan and the engine's own answer disagree
    stderr_tail: str = ""
    python: str | None = None  # the engine's Python the child ran in
    extra: Mapping[str, Any] = {}  # the engine's further observations, as the JSON shows them
    note: str = ""  # the engine's own detail for the summary line (what the layers attended)
    observation: Any = None  # the engine's raw observation, for its own rules (not shown)

    @property
    def ran(self) -> bool:
        return self.outcome != "unavailable"

    def to_json(self) -> dict[str, Any]:
        if not self.ran:
            return {"engine": self.engine, "ran": False, "outcome": self.outcome, "reason": self.reason}
        return {"engine": self.engine, "ran": True, "outcome": self.outcome, "versions": dict(self.versions),
                "stages": dict(self.stages), "seconds": self.seconds,
                "error": None if self.error is None else msgspec.to_builtins(self.error),
                "compared": list(self.compared), "differences": list(self.differences),
                "layers": [dict(row) for row in self.layers], **self.extra}

    def summary(self) -> str:
        """One line for the human report: what ran, how it ended, and whether it agreed with the plan."""
        if not self.ran:
            return f"dry run ({self.engine}): not run: {self.reason}"
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items()) or self.engine
        how = self.outcome
        if self.error is not None:
            how = f"{self.error.cls} during {self.error.stage}" + (f" at {self.error.frame}" if self.error.frame else "")
        seconds = "" if self.seconds is None else f" in {self.seconds:g} s"
        done = [stage for stage, status in self.stages.items() if status == "ok"]
        differences = f"; {len(self.differences)} difference(s) from the plan" if self.differences else (
            f"; agrees with the plan on {', '.join(self.compared)}" if self.compared else "")
        note = f"; {self.note}" if self.note else ""
        return f"dry run ({versions}): {how}{seconds}; stages done: {', '.join(done) or 'none'}{differences}{note}"


def stages_reached(order: Sequence[str], done: Sequence[str], failed: str | None = None) -> dict[str, str]:
    """Each stage of `order`: ok when done, error where it `failed`, else not run."""
    return {stage: "ok" if stage in done else "error" if stage == failed else "not run" for stage in order}


class DryRunner(ABC):
    """Runs the engine's own code on a weightless copy of the model, in a child process."""

    @abstractmethod
    def run(self, spec: ModelSpec, settings: BaseModel, plan: Plan[object], options: Mapping[str, Any]) -> DryRun:
        """What the engine did."""


class EngineProfile(ABC):
    """One engine at the versions in `pins`. Register it in `kvdoctor.engines.PROFILES`."""

    name: ClassVar[str]
    pins: ClassVar[Mapping[str, str]]  # taken from kvdoctor.engines.pins.PINS
    # the distribution whose releases (kvdoctor.engines.pins.PROFILED) the profile describes, each from the
    # release data in its package; None: only the pinned one
    release_dist: ClassVar[str | None] = None
    Settings: ClassVar[type[BaseModel]]  # its deploy-file section (named `name` with - as _)
    reference: ClassVar[bool] = False  # True: the model's own meaning, not a serving engine (no engine row)
    probe_extra: ClassVar[tuple[str, str] | None] = None  # (the pip extra its probes need, what they build)
    dry_run_extra: ClassVar[str | None] = None  # the pip extra a dry run in kvdoctor's own Python needs
    # With a budget: the names the MEM rules give a knob -> its key in the deploy section (they point at it)
    budget_setting_keys: ClassVar[Mapping[str, str]] = {}
    refusal_codes: ClassVar[tuple[str, ...]] = ()  # the catalog codes `plan` may put in `Plan.refusals`
    # codes `plan` may also put there whose catalog entries another rule owns (vLLM's MEM002/MEM004/MEM014,
    # checks.budget's): the refusal rule reports them too, so `--select MEM004` keeps the plan's finding
    shared_refusal_codes: ClassVar[tuple[str, ...]] = ()
    # True: `plan` answers a model whose layers the loader could not read (`ModelSpec.unread`) where the engine's
    # own config stage refuses it before reading any layer, and raises `unread` otherwise
    answers_unread: ClassVar[bool] = False

    def plan(self, spec: ModelSpec, settings: BaseModel) -> Plan[object]:
        """How the engine lays out this model's caches and what it refuses; imports no torch or mlx."""
        raise NotImplementedError(f"{self.name} has no layout plan")

    def probes(self) -> Sequence[Probe]:
        """Probes that build and drive real caches for this engine (none by default)."""
        return ()

    def dry_run(self) -> DryRunner | None:
        """The engine's own code in a child process, when kvdoctor can run it (none by default)."""
        return None

    def budget(self, facts: ModelFacts, config: Mapping[str, Any], settings: BaseModel, inputs: BudgetSettings,
               all_modes: bool) -> tuple[Sequence[Budget], dict[str, Any]]:
        """KV sizing the engine's way: (one budget per mode, how the memory figure was obtained)."""
        raise NotImplementedError(f"{self.name} has no budget model")

    def budget_view(self, row: Mapping[str, Any]) -> BudgetView:
        """One row of the budget document (a `Budget.to_json`) in this engine's terms, for the reports."""
        raise NotImplementedError(f"{self.name} has no budget model")

    def budget_facts(self, spec: ModelSpec) -> ModelFacts:
        """The layers as this engine sizes them (InputError for a layer kind its budget cannot price).
        By default the config's own layer kinds; an engine that builds some layers differently (vLLM's
        Mamba-2 and short-convolution state) says so here."""
        from kvdoctor.engines.budget.facts import facts_from_spec

        return facts_from_spec(spec)

    def fit(self, spec: ModelSpec, facts: ModelFacts, gpu: Any, layout: Mapping[str, Any], request: Any,
            settings: Mapping[str, Any]) -> Any:
        """The whole start-up arithmetic of one parallel layout on one GPU (`engines.budget.fit.FitRow`):
        weights per rank, the memory the engine leaves for KV caches, and what that serves."""
        raise NotImplementedError(f"{self.name} has no fit model")

    def fit_layouts(self, facts: ModelFacts, config: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
        """The parallel layouts of `gpus` GPUs the engine can start, plainest first."""
        raise NotImplementedError(f"{self.name} has no fit model")

    def report(self, plan: Plan[object], observations: Mapping[str, object]) -> dict[str, Any]:
        """The engine's part of the JSON `info`, from the plan and what the probes observed."""
        return {}

    @classmethod
    def can_plan(cls) -> bool:
        return cls.plan is not EngineProfile.plan

    @classmethod
    def can_budget(cls) -> bool:
        return cls.budget is not EngineProfile.budget

    @classmethod
    def can_fit(cls) -> bool:
        return cls.fit is not EngineProfile.fit
