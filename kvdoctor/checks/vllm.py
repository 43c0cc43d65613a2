"""VLM020-VLM023: where vLLM silently does something other than what config.json means (windows it
drops or applies differently, HMA off reserving full length, a window applied to every layer, MTP
modules without a cache). The logic is kvdoctor.engines.vllm.differences; this module only wires it."""
from __future__ import annotations

from typing import Iterable

from kvdoctor.checks import Rule
from kvdoctor.context import Context
from kvdoctor.model import Finding

RULE = Rule(codes=("VLM020", "VLM021", "VLM022", "VLM023"), engines=("vllm",))


def run(ctx: Context) -> Iterable[Finding]:
    from kvdoctor.engines.vllm.differences import differences

    return differences(ctx.spec, ctx.plan)
