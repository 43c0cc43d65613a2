"""The mask-routing probe (SWA001-SWA004, ENG010) on model code from outside mlx-lm, written here the
way out-of-tree model code subclasses mlx-lm, and the cache contract it relies on."""
from __future__ import annotations

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from helpers import REAL, SHORT
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options
from kvdoctor.checks.context import Context
from kvdoctor.engines.deploy import Deploy, deploy_from
from kvdoctor.engines.sglang_mlx.profile import mlx_config, plan_from
from kvdoctor.load.loader import load_model
from kvdoctor.engines.sglang_mlx.caches import (FULL_MASK_FROM_WINDOW, ContiguousKVCache, OffsetShim, WindowedKVCache, attention_mask,
                                 canary, positions_of)
from kvdoctor.engines.sglang_mlx.mlxlm import Skeleton, shrunk_config, use_cheap_import
from kvdoctor.engines.sglang_mlx.probes import _allowed_by_kernel, _allowed_from_mask

use_cheap_import()
from mlx_lm.models import gpt_oss  # noqa: E402
from mlx_lm.models.base import create_attention_mask  # noqa: E402

SEED_000 = FULL_MASK_FROM_WINDOW


# ---- out-of-tree model code ----------------------------------------------------------------------

class FullMaskFromFirstCache(gpt_oss.GptOssMoeModel):
    """Takes its full-attention mask from cache[0], although layer 0 slides."""

    def __call__(self, inputs, cache=None, input_embeddings=None):
        x = self.embed_tokens(inputs)
        full_mask = create_attention_mask(x, cache[0])
        swa_mask = create_attention_mask(x, cache[self.swa_idx], window_size=self.window_size)
        for layer, c, kind in zip(self.layers, cache, self.layer_types):
            x = layer(x, full_mask if kind == "full_attention" else swa_mask, c)
        return self.norm(x)


class OneMaskForAll(gpt_oss.GptOssMoeModel):
    """Hands every layer the mask of one layer type (`use`: "full" or "sliding")."""

    use = "full"

    def __call__(self, inputs, cache=None, input_embeddings=None):
        x = self.embed_tokens(inputs)
        if self.use == "full":
            mask = create_attention_mask(x, cache[self.ga_idx])
        else:
            mask = create_attention_mask(x, cache[self.swa_idx], window_size=self.window_size)
        for layer, c in zip(self.layers, cache):
            x = layer(x, mask, c)
        return self.norm(x)


class SlidingMaskForAll(OneMaskForAll):
    use = "sliding"


class DraftOnDecodeBlock(gpt_oss.TransformerBlock):
    """Runs an extra (draft) attention on single-token steps, sharing the layer's cache; the backend
    wraps only the first attention child, so this one reaches the decode shim."""

    def __init__(self, config):
        super().__init__(config)
        self.draft_attn = gpt_oss.AttentionBlock(config)

    def __call__(self, x, mask, cache=None):
        x = super().__call__(x, mask, cache)
        if x.shape[1] == 1:
            x = x + self.draft_attn(x, mask, cache)
        return x


def model_with(container_class=None, block_class=None):
    """gpt-oss-20b's config and mlx-lm's gpt-oss Model, with a custom container or layer class."""
    spec = load_model(str(REAL / SHORT["gpt-oss-20b"]))
    args = gpt_oss.ModelArgs.from_dict(shrunk_config(mlx_config(spec)))
    model = gpt_oss.Model(args)
    if container_class is not None:
        model.model = container_class(args)
    if block_class is not None:
        model.model.layers = [block_class(args) for _ in model.model.layers]
    return spec, model


def probe_findings(spec, model, deploy: Deploy | None = None) -> tuple[list, dict]:
    """The mask-routing rule's findings for this model object, and the profile's report (`info`)."""
    from kvdoctor.pipeline.check import run_probes
    from kvdoctor.checks import swa
    from kvdoctor.engines import profile

    deploy = deploy or Deploy()
    settings = deploy.settings("sglang-mlx")
    plan = plan_from(spec, settings, Skeleton("gpt_oss", model=model))
    sglang_mlx = profile("sglang-mlx")
    observations, over = run_probes(sglang_mlx, {"mask_routing"}, spec, plan, deploy, settings)
    assert over == []
    ctx = Context(spec=spec, engine="sglang-mlx", deploy=deploy, plan=plan, observations=observations)
    opts = Options(catalog=builtin_catalog(), engine="sglang-mlx")
    return [opts.catalog.complete(f, opts.severity_overrides) for f in swa.run(ctx)], sglang_mlx.report(plan, observations)


def by_code(findings: list) -> dict:
    out: dict = {}
    for f in findings:
        out.setdefault(f.code, []).append(f)
    return out


# ---- the checks ----------------------------------------------------------------------------------

def test_stock_gpt_oss_passes_every_probe():
    spec, model = model_with()
    findings, info = probe_findings(spec, model)
    assert findings == []
    assert info["sglang_mlx"]["probe"]["verified"] == 24 * 7


def test_full_mask_from_a_sliding_cache_is_swa001_naming_both_layers():
    spec, model = model_with(FullMaskFromFirstCache)
    findings, _ = probe_findings(spec, model)
    found = by_code(findings)
    assert list(found) == ["SWA001"] and len(found["SWA001"]) == 1
    f = found["SWA001"][0]
    assert f.layer == 1 and f.severity == "error"
    assert f.evidence["maker"] == 0 and f.evidence["offset"] == 131 and f.evidence["window"] == 128
    assert f.evidence["consumers"] == list(range(1, 24, 2))
    assert f.engine_error == {"class": "RuntimeError", "message": SEED_000, "stage": "prefill"}
    assert "layer 1 takes its full-context mask from layer 0's sliding-window cache" in f.message
    assert "extend chunk of 2 tokens" in f.message


def test_swa001_shows_up_at_the_first_chunk_past_the_window():
    spec, model = model_with(FullMaskFromFirstCache)
    deploy = deploy_from({"context_length": 32768, "sglang_mlx": {"chunked_prefill_size": 129}})
    findings, info = probe_findings(spec, model, deploy)
    (f,) = findings
    assert f.code == "SWA001" and f.evidence["steps"][0] == "prefill chunk 2/2 (2 tokens)"
    assert f.evidence["offset"] == 129 and "longer than chunked_prefill_size (129 tokens)" in f.message
    assert info["sglang_mlx"]["probe"]["steps"][:2] == ["prefill chunk 1/2 (129 tokens)",
                                                                        "prefill chunk 2/2 (2 tokens)"]


def test_full_mask_on_sliding_layers_attends_one_key_too_many():
    spec, model = model_with(OneMaskForAll)
    findings, _ = probe_findings(spec, model)
    found = by_code(findings)
    assert set(found) == {"SWA003"}
    native = {f.evidence["steps"][0]: f for f in found["SWA003"] if not f.evidence["batched"]}
    prefill = native["prefill of 131 tokens"]
    assert prefill.layer == 0 and prefill.evidence["window"] == 128
    # the first query past the window sees 129 keys (0..128) instead of 1..128
    assert prefill.evidence["query"] == 128 and prefill.evidence["count"] == 129
    assert prefill.evidence["expected"] == "1..128"
    decode = native["native decode 1/3"]
    assert "one key more than the window (W + 1)" in decode.message
    assert decode.evidence["attended"] == "5..133" and decode.evidence["expected"] == "6..133"
    assert [f.layer for f in found["SWA003"]] == [0, 0]  # prefill (and extend), native decode; batched is right
    assert all(f.evidence["layers"] == list(range(0, 24, 2)) for f in found["SWA003"])


def test_sliding_mask_on_full_layers_loses_context_then_mismatches_width():
    spec, model = model_with(SlidingMaskForAll)
    findings, _ = probe_findings(spec, model)
    found = by_code(findings)
    lost = found["SWA003"][0]
    assert lost.evidence["window"] is None and lost.layer == 1
    assert "positions of context lost" in lost.message
    width = found["SWA002"][0]
    assert width.layer == 1 and width.evidence["keys"] > width.evidence["mask_width"]
    assert "SWA001" not in found


def test_second_attention_child_stores_into_the_decode_shim():
    spec, model = model_with(block_class=DraftOnDecodeBlock)
    findings, _ = probe_findings(spec, model)
    found = by_code(findings)
    f = found["ENG010"][0]
    assert f.engine_error == {"class": "RuntimeError", "message": "AttentionOffsetCache should not store data",
                              "stage": "decode"}
    assert f.message.startswith("mlx_lm.models.gpt_oss.AttentionBlock stores keys") and f.evidence["layers"] == [0]
    assert f.layer == 0 and f.evidence["steps"] == ["batched decode 1/2"]


# ---- the cache contract --------------------------------------------------------------------------

def feed(cache, start: int, n: int, heads: int = 2, dim: int = 8):
    keys = canary(range(start, start + n), heads, dim, mx.bfloat16)
    return cache.update_and_fetch(keys, keys)


def test_windowed_cache_refuses_a_full_mask_only_past_the_window():
    cache = WindowedKVCache(layer=0, window=4)
    feed(cache, 0, 4)
    assert cache.make_mask(1) is None  # nothing dropped yet: a full mask is still possible
    feed(cache, 4, 1)
    with pytest.raises(RuntimeError, match="^" + SEED_000 + "$"):
        cache.make_mask(1)


def test_windowed_decode_returns_w_plus_1_keys_and_masks_the_oldest():
    cache = WindowedKVCache(layer=0, window=4)
    feed(cache, 0, 10)
    mask = cache.make_mask(1, window_size=4)
    keys, _ = feed(cache, 10, 1)
    assert positions_of(keys).tolist() == [6, 7, 8, 9, 10]
    assert np.array(mask).tolist() == [[False, True, True, True, True]]
    trailing, _ = cache.get_kv(4)
    assert positions_of(trailing).tolist() == [7, 8, 9, 10]
    assert cache.offset == 11 and cache.local <= 4 + 10


def test_contiguous_cache_keeps_everything_and_reads_a_trailing_window():
    cache = ContiguousKVCache(layer=1)
    feed(cache, 0, 300)
    keys, _ = feed(cache, 300, 2)
    assert positions_of(keys).tolist() == list(range(302))
    assert positions_of(cache.get_kv(5)[0]).tolist() == [297, 298, 299, 300, 301]


def test_offset_shim_refuses_to_store():
    with pytest.raises(RuntimeError, match="AttentionOffsetCache should not store data"):
        OffsetShim(layer=0, offset=3).update_and_fetch(mx.zeros((1, 1, 1, 4)), mx.zeros((1, 1, 1, 4)))


def test_canaries_survive_bfloat16_for_long_positions():
    keys = canary(range(70_000, 70_004), 1, 4, mx.bfloat16)
    assert positions_of(keys).tolist() == [70_000, 70_001, 70_002, 70_003]


@pytest.mark.parametrize("n, offset, window", [(5, 0, None), (3, 4, None), (1, 9, 4), (6, 0, 4), (2, 7, 4)])
def test_mask_reading_agrees_with_the_sdpa_kernel(n, offset, window):
    for return_array in (False, True):
        mask = attention_mask(n, offset, window, return_array)
        k = offset + n
        assert (_allowed_from_mask(mask, n, k) == _allowed_by_kernel(mask, n, k)).all()


def test_cheap_import_loads_model_modules_without_transformers_or_torch():
    code = ("import sys; from kvdoctor.engines.sglang_mlx.mlxlm import use_cheap_import; use_cheap_import(); "
            "import mlx_lm.models.gpt_oss, mlx_lm.models.llama; "
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
