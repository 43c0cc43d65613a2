"""MiniMax-M3's sparse attention pool in SGLang's static plan: `MiniMaxSparseKVPool`, its index rows in the cell
and the Hopper page of 128, against SGLang 0.5.23's own start-up (goldens/measured/sglang_check-set12.json.gz,
NVIDIA's MiniMax-M3-NVFP4 config, every setting of set 12), and the release ranges of the index dtype and sizing."""
from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest

from kvdoctor.engines.sglang.layout import plan_layers
from kvdoctor.engines.sglang.settings import SglangSettings
from kvdoctor.load.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
MODEL = "v12_nvidia__MiniMax-M3-NVFP4"


@cache
def points() -> tuple[dict, ...]:
    doc = json.loads(gzip.decompress((ROOT / "goldens" / "measured" / "sglang_check-set12.json.gz").read_bytes()))
    return tuple(p for p in doc["points"] if p["model"] == MODEL and "sizing_40GiB" in p["result"])


def planned(tmp_path: Path, config: dict, release: str | None = None, **settings):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(str(tmp_path), with_checkpoint=False)
    return plan_layers(spec, SglangSettings(**settings, kv_budget="40GiB").at_release(release))


def test_set12_holds_the_sparse_points():
    assert len(points()) >= 14
    assert {p["result"]["pools_tiny"]["token_to_kv_pool"]["class"] for p in points()} == {"MiniMaxSparseKVPool"}


@pytest.mark.parametrize("index", range(14))
def test_pool_class_and_sizing_match_sglang(tmp_path, index):
    point = points()[index]
    want = point["result"]
    _, refusals, facts = planned(tmp_path, point["config"], **point["settings"])
    assert not refusals
    assert facts.pools["token_to_kv_pool"] == want["pools_tiny"]["token_to_kv_pool"]["class"]
    assert facts.budget["pools"] == {"full": want["sizing_40GiB"]["max_total_num_tokens"]}
    assert facts.budget["max_running_requests"] == want["sizing_40GiB"]["max_running_requests"]


def base_config() -> dict:
    return next(p for p in points() if p["mutation"] == "none" and p["setting"] == "default")["config"]


def test_index_rows_are_in_the_cell(tmp_path):
    """40 GiB over 60 layers of 4 x 128 bf16 keys and values (122,880 B) plus 57 bf16 index keys (14,592 B), in
    pages of 128: 312,320 tokens; with the index value kept on every sparse layer, 57 more rows."""
    _, _, facts = planned(tmp_path / "a", base_config())
    assert facts.budget["pools"] == {"full": (40 << 30) // (122880 + 14592) // 128 * 128} == {"full": 312320}
    both = json.loads(json.dumps(base_config()))
    both["text_config"]["sparse_attention_config"]["sparse_disable_index_value"] = [0] * 60
    _, _, facts = planned(tmp_path / "b", both)
    assert facts.budget["pools"] == {"full": (40 << 30) // (122880 + 2 * 14592) // 128 * 128}


def test_the_page_of_128_is_the_fa3_default_only(tmp_path):
    _, _, facts = planned(tmp_path, base_config(), attention_backend="triton")
    assert facts.budget["pools"] == {"full": (40 << 30) // (122880 + 14592)}


def test_index_in_fp8_on_hopper_from_0_5_23_and_unpriced_before_0_5_21(tmp_path):
    _, _, now = planned(tmp_path / "a", base_config(), kv_cache_dtype="fp8_e4m3")
    assert now.budget["pools"] == {"full": (40 << 30) // (61440 + 7296) // 128 * 128}
    _, _, before = planned(tmp_path / "b", base_config(), kv_cache_dtype="fp8_e4m3", release="0.5.21")
    assert before.budget["pools"] == {"full": (40 << 30) // (61440 + 14592) // 128 * 128}
    _, _, older = planned(tmp_path / "c", base_config(), release="0.5.20")
    assert "0.5.21" in older.budget["not_priced"]
