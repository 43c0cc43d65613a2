"""Every engine's predicted refusals (`Plan.refusals`) as findings: one rule for all profiles.

The profile words the finding (`Refusal.explanation`) and says where it points (a tensor, a deploy
setting or a config key); this rule only carries it over, with the engine's exact error attached.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Iterable, Iterator, Mapping, Sequence

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.engines import PROFILES, profile_class
from kvdoctor.engines.base import Refusal
from kvdoctor.model import Finding, Source

class _RefusalCodes(Mapping[str, tuple[str, ...]]):
    """Each registered profile's refusal codes, read from the registry when asked, with the codes its plan
    shares with another rule (selecting one of those must still run this rule)."""

    def __getitem__(self, engine: str) -> tuple[str, ...]:
        if engine not in PROFILES:
            raise KeyError(engine)
        profile = profile_class(engine)
        return profile.refusal_codes + profile.shared_refusal_codes

    def __iter__(self) -> Iterator[str]:
        return iter(PROFILES)

    def __len__(self) -> int:
        return len(PROFILES)


class _AllRefusalCodes(Sequence[str]):
    """Every registered profile's refusal codes, read on first use: listing them imports every profile
    (and pydantic with them), which a check of one engine never needs (it reads `codes_for`)."""

    @cached_property
    def _codes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(code for name in PROFILES for code in profile_class(name).refusal_codes))

    def __getitem__(self, index: Any) -> Any:
        return self._codes[index]

    def __len__(self) -> int:
        return len(self._codes)

    def __repr__(self) -> str:
        return repr(self._codes)


RULE = Rule(codes=_AllRefusalCodes(), by_engine=_RefusalCodes())  # type: ignore[arg-type]


def where(ctx: Context, refusal: Refusal) -> Source:
    if refusal.where is not None:
        return refusal.where
    if refusal.setting is not None:
        return ctx.deploy.source(refusal.setting)
    return ctx.spec.key_source(refusal.key or "model_type")


def run(ctx: Context) -> Iterable[Finding]:
    for refusal in ctx.plan.refusals:
        yield Finding.at(refusal.code, refusal.explanation or refusal.message, where(ctx, refusal),
                         layer=refusal.layer, severity=refusal.severity, engine_error=refusal.engine_error(),
                         evidence=dict(refusal.evidence))
