"""Bounded resources: probes size their caches up front and a cache past the budget is never built;
the check reports LIM001 instead and the other checks still run."""
from __future__ import annotations

import pytest
from helpers import make_model

from kvdoctor.pipeline import check as check_module
from kvdoctor.catalog import builtin_catalog
from kvdoctor.pipeline.check import Options, check_target, run_probes
from kvdoctor.checks import Check, Rule, all_checks
from kvdoctor.engines import profile
from kvdoctor.engines.base import Cost, Probe
from kvdoctor.checks.lim import ProbeOverBudget, smallest_probe_bytes
from kvdoctor.limits import PROBE_BUDGET_BYTES, PROBE_MIN_TOKENS, human_bytes, tensor_nbytes
from kvdoctor.load.loader import load_model
from kvdoctor.model import ATTENTION_KINDS
from kvdoctor.report import exit_code
from kvdoctor.checks.selection import Selection

PROBE_SLOTS, PROBE_TOKENS = 2, 64
TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "BF16": "bfloat16",
                "F16": "float16", "F32": "float32"}


class KvProbe(Probe):
    """A small real probe: K and V caches [slots, kv_heads, tokens, head_dim] for every attention
    layer, in the layer's dtype, listed (and so sized against the budget) before any is allocated."""

    name = "test_kv"

    def __init__(self, built: list):
        self.built = built

    @staticmethod
    def _shapes(spec):
        layers = [l for l in spec.layers if l.kind in ATTENTION_KINDS]
        return layers, [(l, (PROBE_SLOTS, l.n_kv_heads, PROBE_TOKENS, l.head_dim),
                         TORCH_DTYPES.get(l.dtype or "bfloat16", "bfloat16")) for l in layers]

    def costs(self, spec, plan, settings):
        layers, shapes = self._shapes(spec)
        total = sum(2 * tensor_nbytes(shape, dtype) for _, shape, dtype in shapes)
        biggest = max(shapes, key=lambda s: tensor_nbytes(s[1], s[2]))[0]
        return [Cost(f"K/V caches for {len(layers)} attention layers", total, biggest.sources.get("n_kv_heads"),
                     biggest.index)]

    def run(self, spec, plan, settings, fits):
        import torch

        if fits < 1:
            return None
        _, shapes = self._shapes(spec)
        for _, shape, dtype in shapes:
            for _ in "kv":
                cache = torch.zeros(shape, dtype=getattr(torch, dtype))
                self.built.append(cache.nbytes)
        assert sum(self.built) == self.costs(spec, plan, settings)[0].nbytes  # the up-front size was allocated
        return len(self.built)


@pytest.fixture
def probe(monkeypatch):
    """The test probe on the hf profile, and a rule that needs it."""
    built: list[int] = []
    monkeypatch.setattr(type(profile("hf")), "probes", lambda self: (KvProbe(built),))
    checks = all_checks() + (Check("budget-probe", Rule(("LIM001",), needs=("probe:test_kv",)), lambda ctx: ()),)
    monkeypatch.setattr(check_module, "all_checks", lambda: checks)
    return built


def huge_heads(cfg: dict) -> None:
    """Within the sanity bounds, yet far past the probe budget: an extra digit or three."""
    cfg.update(num_attention_heads=4096, num_key_value_heads=4096, head_dim=16384)


def big_heads(cfg: dict) -> None:
    """The smallest probe caches fit the budget (512 MiB); the test probe's own do not (8 GiB)."""
    cfg.update(num_attention_heads=256, num_key_value_heads=256, head_dim=1024)


def lim001(result):
    return [f for f in result.findings if f.code == "LIM001"]


def config_line(model_dir, key: str) -> int:
    lines = (model_dir / "config.json").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f'"{key}"' in line)


def test_healthy_model_builds_its_caches(tmp_path, probe):
    m = make_model(tmp_path, "gpt-oss-20b", checkpoint=False)
    result = check_target(str(m), Options(catalog=builtin_catalog()))
    assert result.error is None and lim001(result) == []
    assert len(probe) == 2 * 24 and sum(probe) < PROBE_BUDGET_BYTES
    # gpt-oss's config.json names no dtype: the up-front size assumes 4 bytes, the widest.
    assert smallest_probe_bytes(load_model(str(m)))[0] == 24 * PROBE_MIN_TOKENS * 8 * (64 + 64) * 4


def test_no_probe_runs_when_even_the_smallest_caches_pass_the_budget(tmp_path, probe):
    m = make_model(tmp_path, "llama-3.1-8b", edit=huge_heads)
    result = check_target(str(m), Options(catalog=builtin_catalog()))
    assert result.error is None and probe == []  # nothing was allocated
    [finding] = lim001(result)
    assert finding.name == "probe-over-budget" and finding.severity == "warning"
    assert finding.file == "config.json" and finding.key == "num_key_value_heads"
    assert finding.line == config_line(m, "num_key_value_heads")
    expected = 32 * PROBE_MIN_TOKENS * 4096 * (16384 + 16384) * 2  # BF16, from the checkpoint
    assert finding.evidence == {"what": "the smallest probe caches for 32 layers", "bytes": expected,
                                "budget_bytes": PROBE_BUDGET_BYTES}
    assert "CKPT001" in [f.code for f in result.findings]  # the other checks still ran
    assert exit_code([result], "warning") == 1


def test_a_probe_refuses_caches_past_the_budget(tmp_path, probe):
    m = make_model(tmp_path, "llama-3.1-8b", edit=big_heads, checkpoint=False)
    result = check_target(str(m), Options(catalog=builtin_catalog()))
    assert result.error is None and probe == []
    [finding] = lim001(result)
    expected = 32 * 2 * tensor_nbytes((PROBE_SLOTS, 256, PROBE_TOKENS, 1024), "bfloat16")
    assert finding.evidence == {"what": "K/V caches for 32 attention layers", "bytes": expected,
                                "budget_bytes": PROBE_BUDGET_BYTES}
    assert finding.key == "num_key_value_heads" and finding.layer == 0
    assert "CFG009" not in [f.code for f in result.findings] and "CKPT008" in [f.code for f in result.findings]


def test_lim001_can_be_ignored(tmp_path, probe):
    m = make_model(tmp_path, "llama-3.1-8b", edit=huge_heads, checkpoint=False)
    opts = Options(catalog=builtin_catalog(), selection=Selection(ignore=("LIM001",)))
    result = check_target(str(m), opts)
    assert lim001(result) == [] and probe == []


def test_static_runs_build_nothing_and_still_warn(tmp_path, probe):
    m = make_model(tmp_path, "llama-3.1-8b", edit=huge_heads, checkpoint=False)
    result = check_target(str(m), Options(catalog=builtin_catalog(), static=True))
    assert probe == [] and len(lim001(result)) == 1


class Sized(Probe):
    """Lists caches of the given sizes and records how many of them it was let build."""

    name = "sized"

    def __init__(self, *sizes: int):
        self.sizes = sizes

    def costs(self, spec, plan, settings):
        return [Cost(f"cache {i}", n) for i, n in enumerate(self.sizes)]

    def run(self, spec, plan, settings, fits):
        return fits


def test_budget_boundary(monkeypatch):
    hf = profile("hf")
    for sizes, fits, over in (((PROBE_BUDGET_BYTES,), 1, []),
                              ((1, PROBE_BUDGET_BYTES + 1, 1), 1, ["cache 1"])):
        monkeypatch.setattr(type(hf), "probes", lambda self, sizes=sizes: (Sized(*sizes),))
        seen, findings = run_probes(hf, {"sized"}, None, None, None, None)
        assert seen == {"sized": fits} and [f.evidence["what"] for f in findings] == over
    assert findings[0].message == ("cache 1 would need 1.0 GiB, more than the 1.0 GiB probe budget, so they "
                                   "were not built and the checks that need them did not run")
    assert findings[0].evidence["bytes"] == PROBE_BUDGET_BYTES + 1
    assert str(ProbeOverBudget("x", 5, 4)).startswith("x would need 5 B")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int8", "BF16", "F32"])
def test_sizes_match_real_torch_and_mlx_arrays(dtype):
    import mlx.core as mx
    import torch

    shape = (3, 5, 7)
    name = {"BF16": "bfloat16", "F32": "float32"}.get(dtype, dtype)
    assert tensor_nbytes(shape, dtype) == torch.zeros(shape, dtype=getattr(torch, name)).nbytes
    assert tensor_nbytes(shape, dtype) == mx.zeros(shape, dtype=getattr(mx, name)).nbytes
    assert tensor_nbytes(shape, str(getattr(torch, name))) == tensor_nbytes(shape, dtype)


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 3 * 1024**3, 5 * 1024**6)] == [
        "0 B", "1023 B", "1.0 KiB", "3.0 GiB", "5120.0 PiB"]


def test_headers_share_one_budget_per_checkpoint(tmp_path, monkeypatch):
    """Each shard's header is within the per-file bound, but together they pass the checkpoint's."""
    from badinput_base import base_model

    from kvdoctor.load import checkpoint
    from kvdoctor.errors import InputError

    m = base_model(tmp_path, shards=2)
    lengths = [checkpoint.read_header(p, p.name)[1] for p in sorted(m.glob("*.safetensors"))]
    monkeypatch.setattr(checkpoint, "MAX_TOTAL_HEADER_BYTES", sum(lengths) - 1)
    with pytest.raises(InputError, match=r"model-00002-of-00002\.safetensors: safetensors header length \d+ at "
                                         rf"byte 0 exceeds the {lengths[1] - 1}-byte bound"):
        checkpoint.load_checkpoint(m)
    monkeypatch.setattr(checkpoint, "MAX_TOTAL_HEADER_BYTES", sum(lengths))
    assert len(checkpoint.load_checkpoint(m).files) == 2
