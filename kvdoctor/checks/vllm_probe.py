"""VLM031: an invariant of vLLM's paged KV caches broken on the tensors built from the plan (a sliding
group keeping other than the blocks its window needs, two layers or two tokens sharing a slot, page
sizes differing within a group). The probe (kvdoctor.engines.vllm.probe) observes; this rule reports."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.checks.context import Context
from kvdoctor.model import Finding

RULE = Rule(codes=("VLM031",), engines=("vllm",), needs=("probe:vllm_paged",))


def run(ctx: Context) -> Iterable[Finding]:
    rows = ctx.observations.get("vllm_paged")
    if not isinstance(rows, list):
        return
    where = ctx.spec.key_source("model_type")
    for row in rows:
        for problem in row["problems"]:
            yield Finding.at("VLM031", f"vLLM {row['spec']} group ({row['layers']} layers, block {row['block_size']}): "
                                       f"{problem}", where, evidence={"group": row})
