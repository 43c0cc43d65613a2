"""The vLLM paged-cache probe: real torch tensors per KV cache group, a request across the window."""
from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import at
from kvdoctor.engines.vllm.releases import DEFAULT_BLOCK

from kvdoctor.engines.vllm import probe
from kvdoctor.engines.vllm.profile import plan
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.load.loader import load_model

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
REAL_CONFIGS = MODELS.parent / "configs" / "real"
torch = pytest.importorskip("torch")


def plan_of(name: str, **settings):
    return plan(load_model(str(MODELS / name), library_check=False), VllmSettings(**settings))


def test_sliding_groups_keep_only_their_window():
    probes = probe.run(plan_of("google__gemma-3-1b-it"))
    sliding = [p for p in probes if p.spec == "SlidingWindowSpec"]
    assert len(sliding) == 6 and all(not p.problems for p in probes)
    first = sliding[0]
    # gemma-3-1b: window 512, the release's default block B (16 to 0.33.0, 64 from 0.34.0), 1 KV head of 256;
    # the request is 512 + 2 blocks + 3 tokens, of which the window's blocks and the one it starts in are kept
    block = first.block_size
    assert block == at(DEFAULT_BLOCK, PINS["vllm"]) and first.shapes[first.layer_ids[0]][2:] == (block, 1, 256)
    assert first.tokens == 512 + 2 * block + 3 and first.block_table[:2] == [0, 0]
    assert first.kept_blocks == 512 // block + 1
    full = next(p for p in probes if p.spec == "FullAttentionSpec")
    assert 0 not in full.block_table


def test_hma_off_keeps_every_block():
    (only,) = probe.run(plan_of("google__gemma-3-1b-it", disable_hybrid_kv_cache_manager=True))
    assert only.spec == "FullAttentionSpec" and len(only.layer_ids) == 26
    assert 0 not in only.block_table and not only.problems


def test_mla_and_state_groups_build():
    probes = probe.run(plan_of("moonshotai__Kimi-Linear-48B-A3B-Instruct"))
    mla = next(p for p in probes if p.spec == "MLAAttentionSpec")
    assert mla.shapes[mla.layer_ids[0]][2:] == (576,) and not mla.problems
    assert all(not p.problems for p in probes)


def test_mixed_page_sizes_in_a_group_are_caught():
    got = plan_of("openai__gpt-oss-20b")
    layers = list(got.layers)
    first = got.facts.groups[0].layer_ids[0]
    bad = msgspec.structs.replace(layers[first], extra={**layers[first].extra, "num_kv_heads": 16,
                                                    "page_size_bytes": None})
    layers[first] = bad
    probes = probe.run(msgspec.structs.replace(got, layers=tuple(layers)))
    assert any("different page sizes" in msg for msg in probes[0].problems)


def test_shared_storage_is_caught(monkeypatch):
    real_zeros = torch.zeros
    cache: dict = {}

    def shared(shape, **kw):  # hands every layer of a shape the same tensor
        return cache.setdefault(tuple(shape), real_zeros(shape, **kw))

    monkeypatch.setattr(torch, "zeros", shared)
    probes = probe.run(plan_of("openai__gpt-oss-20b"))
    assert any("share KV storage" in msg for msg in probes[0].problems)


@pytest.mark.parametrize("name", ["google__gemma-4-26B-A4B", "XiaomiMiMo__MiMo-V2-Flash"])
def test_a_group_whose_block_vllm_scaled_builds_tensors_of_that_block(tmp_path, name):
    """vLLM doubles the full-attention group's block (16 -> 32 tokens at 0.33.0, 64 -> 128 from 0.34.0) so that
    its page matches the sliding layers': the probe's tensors hold the group's blocks, and every token lands in
    its slot."""
    import json

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text((REAL_CONFIGS / f"{name}.json").read_text())
    probes = probe.run(plan(load_model(str(d), library_check=False), VllmSettings()))
    full = next(p for p in probes if p.spec == "FullAttentionSpec")
    doubled = 2 * at(DEFAULT_BLOCK, PINS["vllm"])
    assert full.block_size == doubled and full.shapes[full.layer_ids[0]][2] == doubled
    assert all(not p.problems for p in probes), [p.problems for p in probes]
    assert json.loads(json.dumps(probe.report(probes)))  # the observation the rules read
