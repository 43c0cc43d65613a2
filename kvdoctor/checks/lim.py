"""LIM001: caches a probe would build pass the probe budget (`kvdoctor.limits.PROBE_BUDGET_BYTES`).

Caches are sized before they are built, twice over: `run` adds up the smallest caches any probe
builds for the model, and when even those pass the budget no probe runs at all; and each probe lists
what it will build (`kvdoctor.engines.base.Cost`) before it builds anything, the pipeline turning the
first entry past the budget into LIM001 (`ProbeOverBudget.finding`) while the other checks go on.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from kvdoctor.checks import Rule
from kvdoctor.limits import DTYPE_BYTES, PROBE_BUDGET_BYTES, PROBE_MIN_TOKENS, STATE_BYTES, human_bytes
from kvdoctor.model import ATTENTION_KINDS, STATE_KINDS, Finding, LayerSpec, ModelSpec, Source

RULE = Rule(codes=("LIM001",))  # sizes the smallest probe caches up front; the probe stage also reports it

if TYPE_CHECKING:
    from kvdoctor.checks.context import Context


class ProbeOverBudget(Exception):
    """A probe was about to build caches larger than the budget; it builds nothing."""

    def __init__(self, what: str, nbytes: int, budget: int, source: Source | None = None,
                 layer: int | None = None):
        super().__init__(f"{what} would need {human_bytes(nbytes)}, more than the {human_bytes(budget)} probe "
                         "budget, so they were not built and the checks that need them did not run")
        self.what, self.nbytes, self.budget, self.source, self.layer = what, nbytes, budget, source, layer

    def finding(self) -> Finding:
        return Finding.at("LIM001", str(self), self.source, layer=self.layer,
                          evidence={"what": self.what, "bytes": self.nbytes, "budget_bytes": self.budget})


def _smallest_cache_bytes(layer: LayerSpec) -> int:
    heads = layer.n_kv_heads or layer.n_heads or 0
    k = layer.head_dim or 0
    v = layer.v_head_dim or k
    if layer.kind in STATE_KINDS:
        return heads * k * v * STATE_BYTES
    if layer.kind in ATTENTION_KINDS:
        return PROBE_MIN_TOKENS * heads * (k + v) * DTYPE_BYTES.get(layer.dtype or "", 4)
    return 0


def smallest_probe_bytes(spec: ModelSpec) -> tuple[int, LayerSpec | None]:
    """(bytes of the smallest caches any probe builds for this model, the layer that needs most)."""
    sizes = [(_smallest_cache_bytes(layer), layer) for layer in spec.layers]
    total = sum(n for n, _ in sizes)
    return total, max(sizes, key=lambda s: s[0])[1] if sizes else None


def probes_fit(spec: ModelSpec) -> bool:
    return smallest_probe_bytes(spec)[0] <= PROBE_BUDGET_BYTES


def run(ctx: Context) -> Iterable[Finding]:
    """LIM001 when even the smallest probe caches pass the budget (no probe runs then)."""
    total, layer = smallest_probe_bytes(ctx.spec)
    if total > PROBE_BUDGET_BYTES and layer is not None:
        source = layer.sources.get("n_kv_heads") or layer.sources.get("n_heads")
        yield ProbeOverBudget(f"the smallest probe caches for {len(ctx.spec.layers)} layers", total,
                              PROBE_BUDGET_BYTES, source, layer.index).finding()
