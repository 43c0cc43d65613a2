"""Rules. Each module declares itself beside its logic, as a checkov check does:

    RULE = Rule(codes=("SWA001", ...), engines=("sglang-mlx",), needs=("probe:mask_routing",))
    def run(ctx: Context) -> Iterable[Finding]: ...

`codes` are the catalog entries it emits (the catalog test holds each to its entry; an entry no rule
declares is an error kvdoctor names in logs but does not check for yet), `engines` the profiles it
applies to (None: every one), `needs` what the pipeline must provide before it runs: "probe:<name>"
(a probe of the engine profile, built under the memory budget) or "dry_run". A rule with needs
builds caches or runs kernels, so `--static` skips it. Rule modules import nothing heavy at module
level; torch and mlx load inside the probes.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import msgspec

if TYPE_CHECKING:
    from kvdoctor.catalog import Entry
    from kvdoctor.checks.context import Context
    from kvdoctor.model import Finding

DRY_RUN = "dry_run"
PROBE = "probe:"

# The rule modules, in the order they run (findings are sorted afterwards).
RULE_MODULES: tuple[str, ...] = (
    "kvdoctor.checks.cfg",
    "kvdoctor.checks.cfg_semantics",
    "kvdoctor.checks.cfg_geometry",
    "kvdoctor.checks.ckpt",
    "kvdoctor.checks.refusals",
    "kvdoctor.checks.eng",
    "kvdoctor.checks.swa",
    "kvdoctor.checks.pool",
    "kvdoctor.checks.vllm",
    "kvdoctor.checks.vllm_probe",
    "kvdoctor.checks.dryrun",
    "kvdoctor.checks.dryrun_vllm",
    "kvdoctor.checks.dryrun_sglang",
    "kvdoctor.checks.kda_caches",
    "kvdoctor.checks.sglang_layout",
    "kvdoctor.checks.sglang_pools",
    "kvdoctor.checks.sglang_swa_memory",
    "kvdoctor.checks.mlx_lm_probe",
    "kvdoctor.checks.dryrun_mlx_lm",
    "kvdoctor.checks.lim",
    "kvdoctor.checks.budget",
    "kvdoctor.checks.fit",
)
# Rules only `kvdoctor diff` runs (kvdoctor.pipeline.diff), on two releases' answers rather than one check's.
DIFF_MODULES: tuple[str, ...] = ("kvdoctor.checks.upgrade",)


class Rule(msgspec.Struct, frozen=True):
    codes: tuple[str, ...]
    engines: tuple[str, ...] | None = None  # None: runs for every engine
    needs: tuple[str, ...] = ()  # "probe:<name>" or "dry_run"; the plan is always there
    by_engine: Mapping[str, tuple[str, ...]] | None = None  # the codes it can emit per engine, when they differ

    def codes_for(self, engine: str) -> tuple[str, ...]:
        if self.by_engine is not None:
            return self.by_engine.get(engine, ())
        return self.codes if self.engines is None or engine in self.engines else ()

    @property
    def static(self) -> bool:
        """Reads the spec and plan only: builds no caches and runs no kernels."""
        return not self.needs

    @property
    def probes(self) -> tuple[str, ...]:
        return tuple(need[len(PROBE):] for need in self.needs if need.startswith(PROBE))


class Check(msgspec.Struct, frozen=True):
    """One rule module: its declaration and its run function."""

    module: str
    rule: Rule
    run: Callable[[Context], Iterable[Finding]]

    @property
    def codes(self) -> tuple[str, ...]:
        return self.rule.codes

    def applies_to(self, engine: str) -> bool:
        return bool(self.rule.codes_for(engine))


def load_check(module: str) -> Check:
    loaded = importlib.import_module(module)
    return Check(module, loaded.RULE, loaded.run)


@lru_cache(maxsize=1)
def all_checks() -> tuple[Check, ...]:
    return tuple(load_check(module) for module in RULE_MODULES)


@lru_cache(maxsize=1)
def rule_modules_by_code() -> dict[str, tuple[str, ...]]:
    """Each code a registered rule emits -> the rule modules that emit it, in the order they run."""
    out: dict[str, tuple[str, ...]] = {}
    for check in (*all_checks(), *(load_check(module) for module in DIFF_MODULES)):
        for code in check.codes:
            out[code] = (*out.get(code, ()), check.module)
    return out


def checking_module(code: str) -> str:
    """The first rule module that emits `code`, or "none yet"."""
    return next(iter(rule_modules_by_code().get(code, ())), "none yet")


def preventers(entry: Entry) -> list[str]:
    """The check codes that catch this error before deploy: the entry's own code when a rule emits it,
    then the codes its `prevented_by` names."""
    own = [entry.code] if entry.code in rule_modules_by_code() else []
    return own + [c for c in entry.prevented_by if c != entry.code]
