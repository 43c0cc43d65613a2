"""The static vLLM profile against each vLLM release's own start-up code (goldens/vllm_check.json, and
goldens/vllm_check-<release>.json from goldens/releases.py --check), each file held to the release it records.

Each golden point is one config (real, or mutated as issue 14 lists) with one set of engine arguments,
run through vLLM's create_engine_config, its model class on the meta device and its KV planning. The
profile must agree on the outcome (start, or the refusal's class and text), every layer's spec class,
window, chunk, KV heads per rank, head size, dtype and bytes per token, and the KV cache groups (count,
spec classes, layer sets). Block sizes and page bytes are the CPU's in the goldens (see README.md), so
pages are compared per token; numbers inside an admission message depend on them and are masked.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from kvdoctor.engines.pins import PINS, PROFILED
from kvdoctor.engines.vllm.profile import plan
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.engines.vllm.specs import not_planned
from kvdoctor.load.loader import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from golden_text import sets_sorted  # noqa: E402  - tools/vllm_heldout.py compares messages the same way

GOLDENS = Path(__file__).resolve().parent.parent / "goldens"
GOLDEN = json.loads((GOLDENS / "vllm_check.json").read_text())


def compared(points: list[dict]) -> list[dict]:
    """The points the profile answers for: not a refusal only the CPU box raises, nor one of the venv's
    transformers (startup.run_point marks both)."""
    return [p for p in points if p["outcome"]["start"] or not (p["outcome"].get("cpu_only")
                                                               or p["outcome"].get("environment"))]


POINTS = compared(GOLDEN["points"])
# the per-release grid (goldens/releases.py --check) over fixtures/configs/real, unmutated, default and HMA off;
# KVDOCTOR_HELDOUT_REL=1 adds the held-out configs of goldens/heldout-rel to heldout-rel5, which measure
# the profile and are not part of the suite (nothing was changed for them; docs/versions.md has the figures)
RELEASE_FILES = {path: json.loads(path.read_text()) for path in sorted(
    [*GOLDENS.glob("vllm_check-*.json"), *(GOLDENS.glob("heldout-rel*/vllm_check-*.json")
                                            if os.environ.get("KVDOCTOR_HELDOUT_REL") else ())])}
RELEASE_POINTS = [(doc["versions"]["vllm"], p) for doc in RELEASE_FILES.values() for p in compared(doc["points"])]
# held-out sets measured at a later release than vllm_check.json's (docs/vllm.md: Falcon-H1 and set 9 at 0.34.0),
# merged there by tools/vllm_heldout.py --merge: the points that agreed once the profile was fixed for them
HELDOUT_POINTS = [(doc["versions"]["vllm"], p) for doc in (json.loads(path.read_text()) for path in sorted(
    GOLDENS.glob("vllm_heldout-*.json"))) for p in compared(doc["points"])]
SLIDING = ("SlidingWindowSpec", "SlidingWindowMLASpec")
PLATFORM_NUMBERS = ("MEM004",)  # admission: GiB and lengths follow the platform's page sizes


def point_id(p: dict) -> str:
    return f"{p['model']}-{p['mutation']}-{p['setting']}"


def profile_plan(point: dict, tmp_path: Path, release: str):
    model = tmp_path / point["model"]
    model.mkdir()
    (model / "config.json").write_text(json.dumps(point["config"], indent=2))
    spec = load_model(str(model), library_check=False)
    args = cpu_scheduler(point, point.get("engine_args_effective", point["engine_args"]))
    settings = VllmSettings(kv_budget=point["kv_budget_bytes"], **args).at_release(release)
    return plan(spec, settings)


def cpu_scheduler(point: dict, args: dict) -> dict:
    """The CPU box serves an MLA model with chunked prefill off, max_num_batched_tokens at max_model_len and no async
    scheduling (platforms/cpu.py:532-546 and :347 at 0.34.0); only sliding-window caches (DeepSeek-V4's) are sized by
    it, and the profile plans the CUDA defaults: it is given the scheduler the point ran with."""
    fields = point.get("fields") or {}
    tokens = fields.get("max_num_batched_tokens")
    if fields.get("use_mla") and tokens and tokens != args.get("max_num_batched_tokens"):
        return {**args, "max_num_batched_tokens": tokens, "async_scheduling": False}
    return args


def layer_id(name: str) -> int:
    """The layer index of a KV cache name as vLLM keys it: `model.layers.3.self_attn.attn`, `3.attn` where a
    release's model class prefixes its attention without the stack's name (OLMo-2 and GPT-BigCode in 0.30.0), or
    `model.attn.3` (Zamba2's shared attention, whose index is the name's last number)."""
    return int(re.search(r"(?:^|\.)(\d+)(?:\.|$)", name).group(1))


def golden_inner_message(outcome: dict) -> str:
    """pydantic wraps vLLM's ValueError (AssertionError): 'N validation error for X\\n  Value error (Assertion
    failed), MESSAGE [type=...'."""
    text = outcome["message"]
    if outcome["class"] == "ValidationError":
        text = re.split(r"\n  (?:Value error|Assertion failed), ", text, maxsplit=1)[1].rsplit(" [type=", 1)[0]
    return text


def masked(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", text)


def test_goldens_cover_the_issue_grid():
    models = {p["model"] for p in GOLDEN["points"]}
    assert {"deepseek-ai__DeepSeek-V3", "meta-llama__Llama-4-Scout-17B-16E-Instruct"} <= models
    mutations = {p["mutation"] for p in GOLDEN["points"]}
    assert {"none", "layer_types_shifted", "layer_types_truncated", "layer_types_missing", "sliding_window_null",
            "window_no_layer_types", "mtp_appended", "all_sliding"} <= mutations
    settings = {p["setting"] for p in GOLDEN["points"]}
    assert {"default", "hma_off", "len2x", "tp8", "fp8", "prefix_caching"} <= settings
    assert GOLDEN["versions"]["vllm"] in PROFILED["vllm"]
    assert len(POINTS) >= 100


def test_release_goldens_cover_their_configs():
    """Every per-release file is a profiled release's, made by that release over every config of its folder (HMA
    off where the layers' specs differ: goldens/vllm_check_oracle.py); fixtures/configs/real has one per release."""
    assert RELEASE_FILES, "no goldens/vllm_check-<release>.json"
    real = {doc["versions"]["vllm"] for doc in RELEASE_FILES.values() if doc["configs"] == ["fixtures/configs/real"]}
    assert PINS["vllm"] in real
    for path, doc in RELEASE_FILES.items():
        assert path.stem == f"vllm_check-{doc['versions']['vllm']}"
        assert doc["versions"]["vllm"] in PROFILED["vllm"]
        assert doc["grid"] == "release"
        configs = {p.stem for folder in doc["configs"] for p in (GOLDENS.parent / folder).glob("*.json")
                   if not p.name.startswith(("vllm_check-", "sglang_"))}  # SGLang's configs and points held beside
        assert configs and configs <= {p["model"] for p in doc["points"] if p["setting"] == "default"}, path.name
        assert {p["setting"] for p in doc["points"]} <= {"default", "hma_off"}, path.name
        assert {p["mutation"] for p in doc["points"]} == {"none"}, path.name


@pytest.mark.parametrize("point", POINTS, ids=point_id)
def test_profile_matches_vllm(point, tmp_path):
    assert_matches(point, tmp_path, GOLDEN["versions"]["vllm"])


# (release, model) -> why the profile still differs from the release on a held-out point (KVDOCTOR_HELDOUT_REL=1)
RELEASE_GAPS: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("release,point", [
    pytest.param(r, p, marks=[pytest.mark.xfail(reason=RELEASE_GAPS[r, p["model"]], strict=True)]
                 if (r, p["model"]) in RELEASE_GAPS else []) for r, p in RELEASE_POINTS],
    ids=[f"{r}-{point_id(p)}" for r, p in RELEASE_POINTS])
def test_profile_matches_each_release(release, point, tmp_path):
    assert_matches(point, tmp_path, release)


@pytest.mark.parametrize("release,point", HELDOUT_POINTS, ids=[f"{r}-{point_id(p)}" for r, p in HELDOUT_POINTS])
def test_profile_matches_the_held_out_sets(release, point, tmp_path):
    assert_matches(point, tmp_path, release)


def assert_matches(point: dict, tmp_path: Path, release: str) -> None:
    got = profile_plan(point, tmp_path, release)
    outcome = point["outcome"]
    unplanned = not_planned((point["config"].get("architectures") or [""])[0], release)
    if unplanned and not got.refusals:
        assert got.facts.unmodeled and not got.facts.groups  # left to --dry-run (VLM024), nothing guessed
        assert not any("engine_spec" in layer.extra for layer in got.layers)
        return
    if outcome["start"]:
        assert not got.refusals, [r.message for r in got.refusals]
    else:
        assert got.refusals, f"vLLM refused: {outcome['message'][:200]}"
        refusal = got.refusals[0]
        assert refusal.error_class == outcome["class"]
        want = golden_inner_message(outcome)
        if refusal.code == "VLM143":  # the text names the model directory vLLM was given
            # (or, for an auto_map class of another repository, once as a Hub address only)
            given = (re.search(r"The repository (\S+) contains", want) or re.search(r"https://hf\.co/(\S+?)\.\n", want)).group(1)
            want = want.replace(given, str(tmp_path / point["model"]))
        if refusal.code in PLATFORM_NUMBERS:
            assert masked(refusal.message) == masked(want)
        else:
            assert sets_sorted(refusal.message) == sets_sorted(want)
    if unplanned:
        return  # a config-stage refusal, compared above; the model class's specs are not planned
    if point.get("layers"):
        by_index = {l.index: l for l in got.layers}
        by_name = {l.extra["name"]: l for l in got.layers if "name" in l.extra}  # DeepSeek-V4: several per layer
        for row in point["layers"]:
            mine = by_name.get(row["name"]) or by_index[layer_id(row["name"])]
            assert mine.extra["engine_spec"] == row["spec"], row["name"]
            if row["spec"] == "MambaSpec":
                assert mine.extra["state_shapes"] == row["shapes"], row["name"]
                continue
            window = row["window"] if row["spec"] in SLIDING else row["attention_chunk_size"]
            assert mine.engine_window == window, row["name"]
            assert (mine.extra["num_kv_heads"], mine.extra["head_size"], mine.extra["dtype"]) == (
                row["num_kv_heads"], row["head_size"], row["dtype"]), row["name"]
            per_token = mine.extra["page_size_bytes"] // mine.extra["block_size"]
            assert per_token == row["page_size_bytes"] // row["block_size"], row["name"]
        assert len(got.layers) == len(point["layers"])
    if point.get("groups"):
        want = Counter((g["spec"], frozenset(map(layer_id, g["layer_names"]))) for g in point["groups"])
        have = Counter((g.spec, frozenset(g.layer_ids)) for g in got.facts.groups)
        assert have == want
        assert got.facts.hma == point["hma"]["on"]
    if point.get("fields"):
        assert got.facts.max_model_len == point["fields"]["max_model_len"]
        assert got.facts.architecture == point["fields"]["architecture"]
        assert got.facts.is_hybrid == point["fields"]["is_hybrid"]


TRINITY = GOLDENS.parent / "fixtures" / "configs" / "fresh" / "v11_arcee-ai__Trinity-Nano-Preview.json"


def _trinity_plan(tmp_path: Path, release: str, layer_types: list[str] | None = None):
    config = json.loads(TRINITY.read_text())
    assert "layer_types" not in config
    if layer_types is not None:
        config["layer_types"] = layer_types
    model = tmp_path / release
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return plan(load_model(str(model), library_check=False), VllmSettings(kv_budget=40 << 30).at_release(release))


@pytest.mark.parametrize("release", ["0.26.0", "0.30.0", "0.31.0"])
def test_afmoe_without_layer_types_stops_up_to_0_31(release, tmp_path):
    """vLLM's own AfmoeConfig (to 0.31.0) leaves `layer_types` None and the model class indexes it (VLM291)."""
    got = _trinity_plan(tmp_path, release)
    assert [(r.code, r.error_class, r.message) for r in got.refusals] == [
        ("VLM291", "TypeError", "'NoneType' object is not subscriptable")]
    assert "/vllm/model_executor/models/afmoe.py#L" in got.refusals[0].source


def test_afmoe_starts_with_layer_types_or_from_0_32(tmp_path):
    """transformers' AfmoeConfig (0.32.0 on) derives the list; a config that states it starts at any release."""
    derived = _trinity_plan(tmp_path, "0.32.0")
    assert not derived.refusals
    every_fourth = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(56)]
    assert [l.extra["engine_spec"] for l in derived.layers] == [
        "FullAttentionSpec" if t == "full_attention" else "SlidingWindowSpec" for t in every_fourth]
    stated = _trinity_plan(tmp_path, "0.30.0", every_fourth)
    assert not stated.refusals and len(stated.facts.groups) == len(derived.facts.groups)


QWEN3_NEXT = GOLDENS.parent / "fixtures" / "configs" / "real" / "Qwen__Qwen3-Next-80B-A3B-Instruct.json"


def _qwen3_next_plan(tmp_path: Path, release: str, edit: dict):
    config = {**json.loads(QWEN3_NEXT.read_text()), **edit}
    assert "layer_types" not in json.loads(QWEN3_NEXT.read_text())
    model = tmp_path / f"{release}-{len(list(tmp_path.iterdir()))}"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return plan(load_model(str(model), library_check=False), VllmSettings(kv_budget=40 << 30).at_release(release))


def _full_every(n: int, layers: int = 48) -> list[str]:
    return ["FullAttentionSpec" if (i + 1) % n == 0 else "MambaSpec" for i in range(layers)]


@pytest.mark.parametrize("release", ["0.26.0", "0.29.0", "0.31.0"])
def test_qwen3_next_interval_ignored_up_to_0_31(release, tmp_path):
    """vLLM's own Qwen3NextConfig (to 0.31.0) puts full attention on every fourth layer whatever
    `full_attention_interval` says (while `qwen3_next` is in vLLM's own config registry; held-out set 14 at 0.26.0 and 0.29.0)."""
    got = _qwen3_next_plan(tmp_path, release, {"full_attention_interval": 2})
    assert [l.extra["engine_spec"] for l in got.layers] == _full_every(4)
    assert len(got.facts.groups) == 4  # three GDN groups beside the full one, as the goldens record


def test_qwen3_next_interval_read_from_0_32_or_when_layer_types_given(tmp_path):
    """transformers' Qwen3NextConfig (0.32.0 on) derives the list from the interval; a stated list is kept at any
    release, and a layout whose kinds the config has no layer of is left to --dry-run, not guessed."""
    assert [l.extra["engine_spec"] for l in _qwen3_next_plan(
        tmp_path, "0.32.0", {"full_attention_interval": 2}).layers] == _full_every(2)
    stated = ["full_attention" if (i + 1) % 2 == 0 else "linear_attention" for i in range(48)]
    assert [l.extra["engine_spec"] for l in _qwen3_next_plan(
        tmp_path, "0.30.0", {"full_attention_interval": 2, "layer_types": stated}).layers] == _full_every(2)
    every_layer = _qwen3_next_plan(tmp_path, "0.30.0", {"full_attention_interval": 1})
    assert "every fourth layer" in (every_layer.facts.unmodeled or "")


def test_config_code_without_a_model_type_is_remote_code(tmp_path):
    """A config that names its AutoConfig and no model_type (SmallThinker, held-out set 12): transformers' AutoConfig
    refuses the remote code (VLM143), where kvdoctor read the config as bad input; a Llama config stays quiet."""
    cfg = json.loads((Path(__file__).parent.parent / "fixtures/configs/real/meta-llama__Llama-3.2-1B-Instruct.json")
                     .read_text())
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps(cfg))
    assert not plan(load_model(str(tmp_path / "plain"), with_checkpoint=False), VllmSettings()).refusals
    cfg.pop("model_type")
    cfg["auto_map"] = {"AutoConfig": "configuration_smallthinker.SmallThinkerConfig"}
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "config.json").write_text(json.dumps(cfg))
    [refusal] = plan(load_model(str(tmp_path / "code"), with_checkpoint=False), VllmSettings()).refusals
    assert refusal.code == "VLM143" and "contains custom code which must be executed" in refusal.message


QWEN3_5 = GOLDENS.parent / "fixtures" / "configs" / "real" / "Qwen__Qwen3.5-35B-A3B.json"


@pytest.mark.parametrize("release,error_class", [("0.26.0", "ValidationError"), ("0.31.0", "ValidationError"),
                                                 ("0.32.0", "StrictDataclassClassValidationError")])
def test_qwen3_5_layer_types_length_as_each_release_reads_it(release, error_class, tmp_path):
    """Up to 0.31.0 vLLM's own Qwen3.5 classes run the length check as a plain ValueError, which ModelConfig wraps;
    from 0.32.0 transformers' strict class raises it (releases.QWEN3_5_OWN_CONFIG; held-out set 15 at 0.26.0 and
    0.29.0). The whole list is still planned at every release."""
    config = json.loads(QWEN3_5.read_text())
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / "config.json").write_text(json.dumps(config))
    assert not plan(load_model(str(tmp_path / "whole"), library_check=False),
                    VllmSettings(kv_budget=40 << 30).at_release(release)).refusals
    config["text_config"]["layer_types"] = config["text_config"]["layer_types"][:20]
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_text(json.dumps(config))
    [refusal] = plan(load_model(str(tmp_path / "cut"), library_check=False),
                     VllmSettings(kv_budget=40 << 30).at_release(release)).refusals
    assert refusal.error_class == error_class
    assert "`num_hidden_layers` (40) must be equal to the number of `layer_types` (20)" in refusal.message


LAGUNA_NULL_WINDOW = GOLDENS / "heldout-rel6" / "v15_poolside__Laguna-XS.2-FP8__sliding_window_null.json"


@pytest.mark.parametrize("release,refused", [("0.26.0", False), ("0.30.0", False), ("0.31.0", True)])
def test_a_release_with_its_own_config_class_is_not_held_to_transformers_refusal(release, refused, tmp_path):
    """Up to 0.30.0 vLLM reads `laguna` with its own LagunaConfig (`sliding_window: int | None`, configs/laguna.py:49
    @ 0.26.0), which takes a null window and starts with every layer full attention (heldout-rel6 at 0.26.0 and
    0.29.0); from 0.31.0 transformers' strict class reads it and refuses the null (VLM032). Where the release's own
    class reads the type, the plan says transformers' refusal is not that release's instead of predicting it."""
    (tmp_path / "config.json").write_text(LAGUNA_NULL_WINDOW.read_text())
    got = plan(load_model(str(tmp_path), library_check=False), VllmSettings().at_release(release))
    assert [r.code for r in got.refusals] == (["VLM032"] if refused else [])
    assert any("config class of its own" in note for note in got.notes) != refused
    if not refused:
        assert {l.extra["engine_spec"] for l in got.layers} == {"FullAttentionSpec"}


DSV4_FLASH = GOLDENS.parent / "fixtures" / "configs" / "real" / "deepseek-ai__DeepSeek-V4-Flash.json"


@pytest.mark.parametrize("release,compressed", [("0.30.0", True), ("0.32.0", True), ("0.33.0", False)])
def test_dsv4_compression_from_ratios_up_to_0_32(release, compressed, tmp_path):
    """Up to 0.32.0 DeepSeek-V4's attention compresses as `compress_ratios` says whatever `layer_types` types the
    layer; from 0.33.0 it reads `layer_types` (releases.DSV4_READS_COMPRESS_RATIOS; held-out set 15 at 0.31.0)."""
    config = json.loads(DSV4_FLASH.read_text())
    config["layer_types"] = ["sliding_attention"] * config["num_hidden_layers"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    got = plan(load_model(str(tmp_path / "m"), library_check=False), VllmSettings().at_release(release))
    specs = {l.extra["engine_spec"] for l in got.layers}
    assert ("MLAAttentionSpec" in specs) == compressed
    assert "SlidingWindowMLASpec" in specs


@pytest.mark.parametrize("index_head_dim, code", [(64, "VLM370"), (128, None)])
def test_dsv4_compressor_takes_heads_of_512_or_128(index_head_dim, code, tmp_path):
    """DeepseekCompressor has a fused quant+cache layout for heads of 512 and 128 only (held-out set 16: V4-Flash with
    `index_head_dim` 64 stops at model build, before any memory check); the published 128 plans its caches."""
    cfg = json.loads((Path(__file__).parent.parent / "fixtures/configs/real/deepseek-ai__DeepSeek-V4-Flash.json")
                     .read_text())
    cfg["index_head_dim"] = index_head_dim
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = plan(load_model(str(tmp_path), with_checkpoint=False), VllmSettings(kv_budget=40 << 30, max_model_len=4096))
    assert [(r.code, r.error_class, r.message) for r in got.refusals if r.code == "VLM370"] == (
        [("VLM370", "ValueError", "Unsupported head_dim for fused quant+cache: 64")] if code else [])
    assert code or got.layers
