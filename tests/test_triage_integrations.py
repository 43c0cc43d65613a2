"""Triage of the integrations' and connectors' runtime messages (issue 43, round 7b): each is named by
its own entry as the integration prints it, older wordings included, and look-alike lines of other
programs are left alone."""
from __future__ import annotations

import io

import pytest

from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.triage import read_lines, triage_lines

CATALOG = builtin_catalog()


def codes_in(text: str) -> list[str]:
    hits, _ = triage_lines(read_lines(io.BytesIO(text.encode())), CATALOG)
    return sorted({h.entry.code for h in hits})


# Lines as the integrations print them, with their loggers' prefixes and filled-in values.
PRINTED = [
    ("(EngineCore_DP0 pid=81) ERROR 03-02 10:00:00 [core.py:1006] AssertionError: Mismatch in tokens to load: 512 vs "
     "768 (tokens in lmcache) - 256 (tokens in vllm) - 0 (full lmcache hits subtracts last token to recalculate "
     "logits) for request cmpl-1", "ENG136"),
    ("AssertionError: Mismatch in number of tokens: 512 vs 768 - 256 for request cmpl-1", "ENG136"),
    ("[2026-01-02 03:04:05,678] LMCache WARNING: Request cmpl-9 failed to load 256 tokens across 16 blocks "
     "(vllm_v1_adapter.py:964:lmcache.integration.vllm.vllm_v1_adapter)", "ENG142"),
    ("(VllmWorker rank=0 pid=7) ERROR 08-18 06:20:39 [core.py:700] RuntimeError: NIXL compatibility hash mismatch. "
     "Local: 1a2b, Remote: 3c4d. Prefill and decode instances have incompatible configurations.", "VLM333"),
    ("AssertionError: Remote P worker with different page/block size is not supported self.block_size=16, "
     "remote_block_size=32", "VLM335"),
    ("AssertionError: Local block size 16 is not divisible by remote block size 24 or vice versa.", "VLM335"),
    ("[2026-05-02 10:11:14 TP0] RuntimeError: Page size mismatch: prefill server has page_size=64, but decode server "
     "has page_size=1. Both servers must use the same --page-size value.", "SGL326"),
    ("[2026-05-02 10:11:14 DP0 TP0] AssertionError: KV cache is full! Bug in memory estimation. available=0, "
     "evictable=0, protected=4096, required_alloc=8192, delta=0, fill=1.0", "SGL233"),
    ("ValueError: kvcached only supports FullAttentionSpec layers", "ENG145"),
    ("ValueError: kvcached only supports FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec, and MambaSpec, got "
     "CrossAttentionSpec in group 1", "ENG145"),
    ("2026-04-02 11:00:01,123 - vllm_mlx.engine_core - WARNING - [Memory pressure] 61.2GB > 58GB threshold, "
     "forced cache clear", "MLX171"),
    ("ERROR:vllm_mlx.scheduler:Cache corruption not recoverable after 2 attempts", "MLX173"),
    ("WARNING 10-06 12:00:01 [offloading_connector.py:281] Cannot store 12 blocks", "VLM345"),
    ("ValueError: LMCache chunk size must be a multiple of SGLang page size, got 100 and 64", "ENG144"),
    ("WARNING 05-12 09:14:02 [arg_utils.py:1653] --preemption-mode is not supported by the V1 Engine. Falling back to "
     "V0. We recommend to remove --preemption-mode from your config in favor of the V1 Engine.", "VLM351"),
    ("AssertionError: disaggregated KV cache transfer parallel group is not initialized", "VLM352"),
    ("ValueError: Unsupported connector type: LMCacheConnectorV1", "VLM353"),
    ("(Worker_TP0 pid=865) ERROR 05-01 15:00:23 [base_worker.py:1455] NIXL transfer failure: transfer_failed | "
     "Context: {'failure_type': 'transfer_failed', 'request_id': 'cmpl-1'}", "VLM354"),
    ("ValueError: vllm model for vllm-instance not found.", "ENG171"),
    ("AssertionError: segment at 576 shares a page with the one ending at 576", "SGL366"),
    ("13:53:19.410  WARNING:vmlx_engine.scheduler: Deferred abort remove failed for chatcmpl-1: RotatingKVCache.filter() "
     "only supports the single-sequence fast path. Multi-sequence batching must use BatchKVCache.", "MLX181"),
]


@pytest.mark.parametrize(("line", "code"), PRINTED, ids=[code for _, code in PRINTED])
def test_an_integration_message_as_printed_is_named_by_its_entry(line, code):
    assert codes_in(line + "\n") == [code]


# Lines that share words with those messages but are about something else.
LOOK_ALIKES = [
    "LMCache INFO: Retrieved 256 out of 256 required tokens (from 256 total tokens)",
    "INFO 08-18 06:20:39 [nixl_connector.py:800] NIXL compatibility check passed (hash=1a2b)",
    "[2026-05-02 10:11:14 TP0] Page size: 64, KV cache dtype: fp8_e4m3",
    "KV cache is full, waiting for running requests to finish",
    "kvcached: using FullAttentionSpec for all 32 layers",
    "[Memory pressure] check skipped: psutil not installed",
    "Cannot store the session: disk quota exceeded",
    "llama_kv_cache: cache corruption detected in slot 0, clearing",
    "INFO 05-12 09:14:02 [arg_utils.py:1700] Using the V1 Engine with --preemption-mode recompute",
    "INFO 05-01 15:00:23 [nixl_connector.py:900] NIXL transfer completed for request cmpl-1",
    "INFO LMCache: registering vllm model for vllm-instance",
    "segment at 576 freed (page 9)",
    "INFO:vmlx_engine.scheduler: single-sequence fast path for chatcmpl-1",
]


@pytest.mark.parametrize("line", LOOK_ALIKES)
def test_a_look_alike_line_names_nothing(line):
    assert codes_in(line + "\n") == []


OFFLOAD_FRAME = (
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/v1/kv_offload/worker/cpu_gpu.py", line {line}, in transfer_async\n'
    "    {code}\n"
    "AssertionError\n"
)


def test_the_offload_block_count_assert_is_named_from_its_frame():
    code = "assert dst_sub_block_count == src_sub_block_count - src_sub_blocks_to_skip"
    assert codes_in(OFFLOAD_FRAME.format(line=121, code=code)) == ["VLM355"]


def test_another_assert_of_the_offload_transfer_names_nothing():
    assert codes_in(OFFLOAD_FRAME.format(line=110, code="assert isinstance(src_spec, BlockIDsLoadStoreSpec)")) == []
