"""The paged KV caches of each vLLM KV cache group, built as torch tensors and probed (a few blocks each).

Per layer, the tensor vLLM's CUDA backends allocate, in their layout with the plan's true per-block
shape and dtype: FlashAttention `(2, num_blocks, block_size, num_kv_heads, head_size)` (K and V),
FlashAttention-MLA `(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)`, a Mamba state
`(num_blocks, *shape)` per state tensor. Then one request that crosses its group's window (or chunk) is
laid out as vLLM's block manager lays it out (block 0 is the null block; blocks wholly before the
window are returned to it), and each layer writes its token positions through the slot mapping.
Invariants: a sliding group keeps exactly the blocks its window needs; no two layers of a group share
storage or a slot; every layer of a group has the same page size (per-block bytes, padding included).
"""
from __future__ import annotations

from typing import Any, Mapping

import msgspec

from kvdoctor.engines.budget.common import cdiv
from kvdoctor.engines.base import Cost, Plan, Probe
from kvdoctor.engines.vllm import specs as S

TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "uint8": "uint8"}
EXTRA_BLOCKS = 2  # the request crosses its window by this many blocks (plus a partial one)


class GroupProbe(msgspec.Struct):
    spec: str
    layer_ids: tuple[int, ...]
    block_size: int
    shapes: dict[int, tuple[int, ...]] = msgspec.field(default_factory=dict)
    tokens: int = 0
    block_table: list[int] = msgspec.field(default_factory=list)
    kept_blocks: int = 0
    expected_kept: int = 0
    problems: list[str] = msgspec.field(default_factory=list)


def layer_shape(extra: Mapping[str, Any], blocks: int, block: int) -> list[tuple[Any, ...]]:
    """The layer's cache tensors for `blocks` blocks of its group's `block` tokens: the group's, not the
    layer's own, because vLLM scales a group's block size until its page matches the others'
    (Gemma-4's and MiMo-V2's full-attention groups hold 32 tokens a block, their layers' specs 16)."""
    spec = extra["engine_spec"]
    if spec == S.MAMBA:
        return [(blocks, *shape) for shape in extra["state_shapes"]]
    if spec == S.MLA:
        return [(blocks, block, extra["head_size"])]
    return [(2, blocks, block, extra["num_kv_heads"], extra["head_size"])]


def request_blocks(spec: str, window: int | None, block: int) -> tuple[int, list[int], int]:
    """(tokens, block table, blocks the window needs) for a request crossing the window by a bit."""
    if spec == S.MAMBA:  # one state block per request, whatever its length
        return 0, [1], 1
    if spec not in (S.SLIDING, S.CHUNKED) or not window:
        tokens = block + EXTRA_BLOCKS * block + 3
        return tokens, list(range(1, cdiv(tokens, block) + 1)), cdiv(tokens, block)
    tokens = window + EXTRA_BLOCKS * block + 3
    table = list(range(1, cdiv(tokens, block) + 1))  # block 0 is vLLM's null block
    # first position any future token still attends: sliding keeps window - 1 keys back, chunked its chunk
    first = tokens - window + 1 if spec == S.SLIDING else (tokens - 1) // window * window
    freed = first // block
    table = [0] * freed + table[freed:]
    return tokens, table, cdiv(tokens, block) - freed


class PagedCacheProbe(Probe):
    """The pipeline's face of this module: one unit per KV cache group; observes `report(...)` rows."""

    name = "vllm_paged"

    def costs(self, spec: Any, plan: Plan[Any], settings: Any) -> list[Cost]:
        by_index = {l.index: l for l in plan.layers}
        out = []
        for group in _groups(plan):
            first = by_index[group.layer_ids[0]]
            window = first.engine_window if first.cache != "full" else None
            _, table, _ = request_blocks(first.extra["engine_spec"], window, group.block_size)
            blocks = max(table) + 1
            nbytes = sum((by_index[i].extra.get("page_size_bytes") or 0) * blocks for i in group.layer_ids)
            out.append(Cost(f"vLLM {group.spec} group ({len(group.layer_ids)} layers, {blocks} blocks)", nbytes,
                            layer=group.layer_ids[0]))
        return out

    def run(self, spec: Any, plan: Plan[Any], settings: Any, fits: int) -> list[dict[str, Any]]:
        return report(run(plan, limit=fits))


def _groups(plan: Plan[Any]) -> tuple[Any, ...]:
    """The groups the probe builds: one cache per layer, one page size per group. DeepSeek-V4's several caches per
    layer, packed in groups of unequal pages (engines/vllm/dsv4.py), are not probed."""
    if plan.facts is None or plan.refusals or plan.facts.architecture == S.DSV4:
        return ()
    return tuple(plan.facts.groups)


def run(plan: Plan[Any], device: str = "cpu", limit: int | None = None) -> list[GroupProbe]:
    import torch

    by_index = {l.index: l for l in plan.layers}
    out = []
    for group in _groups(plan)[:limit]:
        layers = [by_index[i] for i in group.layer_ids]
        first = layers[0]
        window = first.engine_window if first.cache != "full" else None
        probe = GroupProbe(group.spec, group.layer_ids, group.block_size)
        tokens, table, expected = request_blocks(first.extra["engine_spec"], window, group.block_size)
        probe.tokens, probe.block_table, probe.expected_kept = tokens, table, expected
        probe.kept_blocks = sum(1 for b in table if b)
        blocks = max(table) + 1
        caches, spans, pages = {}, [], set()
        for layer in layers:
            dtype = getattr(torch, TORCH_DTYPES.get(layer.extra["dtype"], "bfloat16"))
            tensors = [torch.zeros(shape, dtype=dtype, device=device) for shape in layer_shape(layer.extra, blocks, group.block_size)]
            probe.shapes[layer.index] = tuple(tensors[0].shape)
            caches[layer.index] = tensors
            per_block = sum(t.numel() * t.element_size() for t in tensors) // blocks
            pages.add(max(per_block, layer.extra.get("page_size_bytes") or per_block))
            spans += [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), layer.index) for t in tensors]
        if len(pages) > 1:
            probe.problems.append(f"layers of one group have different page sizes: {sorted(pages)}")
        spans.sort()
        for (_, e1, a), (s2, _, b) in zip(spans, spans[1:]):
            if s2 < e1:
                probe.problems.append(f"layers {a} and {b} share KV storage")
        if first.extra["engine_spec"] != S.MAMBA:
            _write_and_check(probe, caches, tokens, table, group.block_size)
        if probe.kept_blocks != probe.expected_kept:
            probe.problems.append(f"{probe.kept_blocks} blocks kept, the window needs {probe.expected_kept}")
        out.append(probe)
    return out


def _write_and_check(probe: GroupProbe, caches: dict, tokens: int, table: list[int], block: int) -> None:
    """Every layer writes position + 1 into the key slot of every token still in a kept block; each
    slot must read back its own position, in every layer (no slot written twice)."""
    import torch

    slots = [table[p // block] * block + p % block for p in range(tokens) if table[p // block]]
    positions = [p for p in range(tokens) if table[p // block]]
    if len(set(slots)) != len(slots):
        probe.problems.append("two tokens map to one slot")
    index = torch.tensor(slots)
    values = torch.tensor(positions, dtype=torch.float32) + 1
    for layer_id, tensors in caches.items():
        cache = tensors[0]
        keys = cache[0] if cache.dim() == 5 else cache  # (blocks, block, heads, head) or MLA (blocks, block, d)
        flat = keys.reshape(-1, *keys.shape[2:])
        flat[index] = values.to(flat.dtype).reshape(-1, *([1] * (flat.dim() - 1))).expand(-1, *flat.shape[1:])
        back = flat[index].reshape(len(slots), -1)[:, 0].to(torch.float32)
        if not torch.equal(back, values.to(flat.dtype).to(torch.float32)):
            probe.problems.append(f"layer {layer_id}: a slot does not hold the token written to it")
        if flat[0:block].abs().sum() != 0:  # the null block must stay untouched
            probe.problems.append(f"layer {layer_id}: the null block was written")


def report(probes: list[GroupProbe]) -> list[dict[str, Any]]:
    return [{"spec": p.spec, "layers": len(p.layer_ids), "block_size": p.block_size,
             "shape_first_layer": list(p.shapes[p.layer_ids[0]]), "request_tokens": p.tokens,
             "block_table": p.block_table, "kept_blocks": p.kept_blocks, "problems": p.problems} for p in probes]
