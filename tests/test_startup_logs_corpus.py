"""The start-up log corpus that `fit` is calibrated and validated on (issue 40): real vLLM and SGLang start-up
logs from public threads, repositories and pages, one YAML each in tests/data/startup-logs/, with the model's
published config.json beside them. docs/startup-logs.md says how they were collected, how they are split, and
lists every log; these tests hold the files to that description."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "startup-logs"
CONFIGS = CORPUS / "configs"
DOC = ROOT / "docs" / "startup-logs.md"
FILES = sorted(CORPUS.glob("*.yaml"))
IDS = [path.stem for path in FILES]

MIN_LOGS = 30
SPLIT_SEED = b"kvdoctor-issue-40:"
GPUS = set(json.loads((ROOT / "kvdoctor" / "data" / "gpus.json").read_text())["gpus"])  # fit's presets
FIELDS = {"source": str, "date": str, "engine": str, "version": str, "version_stated": bool, "gpu": str,
          "gpu_stated": bool, "gpu_count": int, "model": str, "settings": dict, "lines_kind": str, "lines": list,
          "observed": dict, "notes": str, "part": str}
OPTIONAL = {"config_missing": str, "gpu_memory_gib": float, "kv_only": str, "fitted": bool,
            "collected_after_calibration": str, "config_model": str}
# The sets collected after a calibration and scored before any change they prompted, in the order collected.
HELD_OUT = {"held-out", "fresh", "fresh2", "fresh3", "fresh4"}
# Observed figures that are not printed numbers: flags set from what the log shows.
FLAGS = {"refused"}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def config_dir(model: str) -> Path:
    return CONFIGS / model.replace("/", "__")


def renderings(value: float) -> set[str]:
    """The ways a log may print a figure: as written, with thousands separators, or with a trailing zero."""
    forms = {str(value)}
    if isinstance(value, int):
        forms.add(f"{value:,}")
    else:
        forms |= {f"{value:.2f}", f"{value:.1f}"}
    return forms


def full_attention_everywhere(config: dict) -> bool:
    """True when every layer keeps a full-length KV cache (no windows, chunks or recurrent layers), so vLLM's
    token count is exactly its concurrency times max_model_len."""
    text = config.get("text_config", config)
    if any(kind != "full_attention" for kind in text.get("layer_types") or []):
        return False
    if text.get("sliding_window") and text.get("use_sliding_window", True) is not False:
        return False
    hybrid_keys = ("attention_chunk_size", "full_attention_interval", "linear_attn_config", "hybrid_override_pattern",
                   "layers_block_type", "kv_lora_rank")
    return not any(text.get(key) for key in hybrid_keys)


def test_the_corpus_is_large_enough_and_split_in_halves():
    assert len(FILES) >= MIN_LOGS, f"{len(FILES)} logs, the issue asks for at least {MIN_LOGS}"
    parts = [load(path)["part"] for path in FILES]
    assert abs(parts.count("calibration") - parts.count("validation")) <= 1


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_each_log_has_the_fields(path):
    doc = load(path)
    assert set(FIELDS) <= set(doc) <= set(FIELDS) | set(OPTIONAL), sorted(set(doc) ^ set(FIELDS))
    for key, kind in {**FIELDS, **OPTIONAL}.items():
        if key in doc:
            assert isinstance(doc[key], kind), f"{key}: {doc[key]!r} is not {kind.__name__}"
    assert doc["engine"] in {"vllm", "sglang"}
    assert doc["gpu"] in GPUS or "gpu_memory_gib" in doc  # another card: the memory it reports
    assert doc["gpu_count"] >= 1
    assert doc["lines_kind"] in {"log", "summary", "mixed"}
    assert doc["lines"] and all(isinstance(line, str) and line.strip() for line in doc["lines"])
    assert doc["observed"] and doc["notes"].strip() and doc["version"].strip()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", doc["date"])
    assert doc["part"] in {"calibration", "validation"} | HELD_OUT
    assert doc["part"] not in HELD_OUT or "collected_after_calibration" in doc


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_each_source_is_a_pinned_public_url(path):
    source = load(path)["source"]
    assert re.fullmatch(r"https://[\w.-]+/\S+", source), source
    if "github.com" in source and "/blob/" in source:
        assert re.search(r"/blob/[0-9a-f]{40}/", source), f"{source}: a file link must name its commit"
    elif "github.com" in source:
        assert re.search(r"/(issues|pull|discussions)/\d+$", source), f"{source}: not an issue, PR or discussion"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_each_model_has_its_published_config_or_says_why_not(path):
    doc = load(path)
    folder = config_dir(doc.get("config_model") or doc["model"])
    if "config_missing" in doc:
        assert doc["config_missing"].startswith(doc["model"] + ":"), "the reason names the model it is about"
        assert not folder.exists(), f"{folder.name} exists: drop config_missing from {path.name}"
        return
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    assert config.get("architectures") or config.get("model_type")
    assert text.get("num_hidden_layers", 0) > 0 or "text_config" in config


def test_every_stored_config_belongs_to_a_log_and_has_a_source():
    used = {config_dir(load(path).get("config_model") or load(path)["model"]).name for path in FILES}
    stored = {folder.name for folder in CONFIGS.iterdir() if folder.is_dir()}
    assert stored <= used, f"configs no log uses: {sorted(stored - used)}"
    sources = (CONFIGS / "SOURCES.md").read_text()
    assert all(f"`{name}`" in sources for name in stored), "every stored config is named in configs/SOURCES.md"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_observed_figures_are_the_ones_the_lines_print(path):
    doc = load(path)
    text = "\n".join(doc["lines"])
    for key, value in doc["observed"].items():
        if key in FLAGS:
            assert value is True
            continue
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{key}: {value!r}"
        blocks = doc["observed"].get("gpu_blocks")
        if key == "kv_tokens" and blocks and value == blocks * doc["settings"].get("block_size", 16):
            continue  # a V0 log prints blocks only: the tokens are its blocks times the block size
        assert any(form in text for form in renderings(value)), f"{key}={value} is not printed in the lines"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_figures_are_consistent(path):
    doc = load(path)
    seen = doc["observed"]
    positive = ("weights_gib", "weights_gb", "kv_tokens", "max_total_num_tokens", "max_concurrency", "total_gpu_gib",
                "k_size_gb", "v_size_gb")
    assert all(seen[key] > 0 for key in positive if key in seen)
    if "total_gpu_gib" in seen:
        assert seen["weights_gib"] + seen.get("available_kv_gib", 0) < seen["total_gpu_gib"]
    refused = seen.get("refused", False)
    if "available_kv_gib" in seen and not refused:
        assert seen["available_kv_gib"] > 0
    if refused:
        max_len = doc["settings"].get("max_model_len", 0)
        lines = "\n".join(doc["lines"])
        failure = re.search(r"(?i)error|failed", lines)
        assert seen.get("available_kv_gib", 0) < 0 or failure or seen.get("kv_tokens", max_len) < max_len
    if "k_size_gb" in seen:
        assert seen["k_size_gb"] == seen["v_size_gb"], "K and V pools of an MHA/GQA model are the same size"
    folder = config_dir(doc.get("config_model") or doc["model"])
    if doc["engine"] == "vllm" and {"kv_tokens", "max_concurrency"} <= set(seen) and (folder / "config.json").exists():
        if full_attention_everywhere(json.loads((folder / "config.json").read_text())):
            per_request = doc["settings"]["max_model_len"]
            assert abs(seen["kv_tokens"] / per_request - seen["max_concurrency"]) < 0.006


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_the_gpu_count_is_the_parallel_layout(path):
    doc = load(path)
    settings = doc["settings"]
    if doc["engine"] == "vllm":
        ranks = (settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1)
                 * settings.get("data_parallel_size", 1))
    else:
        ranks = settings.get("tp_size", 1) * settings.get("pp_size", 1)
    assert ranks == doc["gpu_count"]


def test_the_split_is_the_documented_draw():
    """Each log's part comes from ranking the file names by SHA-256 with a fixed seed: the first half calibrates.
    The draw uses nothing a prediction could influence. A log a term was fitted to (`fitted`) calibrates and a log
    collected after calibration (`collected_after_calibration`) validates, outside the draw."""
    docs = {path.stem: load(path) for path in FILES}
    drawn = [stem for stem, doc in docs.items() if not doc.get("fitted") and not doc.get("collected_after_calibration")]
    ranked = sorted(drawn, key=lambda stem: hashlib.sha256(SPLIT_SEED + stem.encode()).hexdigest())
    half = (len(ranked) + 1) // 2
    expected = {stem: "calibration" if rank < half else "validation" for rank, stem in enumerate(ranked)}
    expected |= {stem: "calibration" if doc.get("fitted") else doc["part"] if doc["part"] in HELD_OUT else "validation"
                 for stem, doc in docs.items() if stem not in expected}
    assert {stem: doc["part"] for stem, doc in docs.items()} == expected
    assert SPLIT_SEED.decode() in DOC.read_text()


def test_the_docs_table_lists_every_log():
    table = DOC.read_text()
    missing = [stem for stem in IDS if f"`{stem}`" not in table]
    assert not missing, f"docs/startup-logs.md does not list {missing}"
