"""Engine releases as data (issue 42): the release a check describes and why, the values that change between
releases, and `kvdoctor diff` over two releases of one engine."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import run

from kvdoctor.engines.pins import PINS, PROFILED
from kvdoctor.engines.releases import Ranged, at, choose, key, split_engine
from kvdoctor.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
GEMMA3 = ROOT / "fixtures" / "models" / "google__gemma-3-1b-it"
QWEN3_NEXT = ROOT / "fixtures" / "models" / "Qwen__Qwen3-Next-80B-A3B-Instruct"


@pytest.fixture
def muse(tmp_path: Path) -> Path:
    """A real config (fixtures/configs/real, source in its SOURCES.md) whose architecture joined SGLang's
    hybrid-SWA allow-list in 0.5.18."""
    d = tmp_path / "Muse-Glimmer-30B"
    d.mkdir()
    shutil.copy(ROOT / "fixtures" / "configs" / "real" / "meta-models__Muse-Glimmer-30B.json", d / "config.json")
    return d


def test_release_keys_order_post_releases_and_reject_other_forms():
    assert key("0.5.15") < key("0.5.15.post1") < key("0.5.16") < key("0.5.23")
    assert key("0.9.0") < key("0.26.0") < key("0.34.0")
    with pytest.raises(InputError):
        key("0.34.0rc1")


def test_a_ranged_table_answers_the_value_in_force_and_fails_outside_it():
    table = (Ranged("old", until="0.27.0"), Ranged("new", since="0.27.0", until="0.30.0"))
    assert [at(table, v) for v in ("0.26.0", "0.27.0", "0.29.0")] == ["old", "new", "new"]
    with pytest.raises(LookupError):
        at(table, "0.30.0")


def test_every_vllm_table_covers_every_profiled_release():
    from kvdoctor.engines.vllm import releases as R

    tables = [value for value in vars(R).values()
              if isinstance(value, tuple) and value and isinstance(value[0], Ranged)]
    assert len(tables) >= 8
    for table in tables:
        for release in PROFILED["vllm"]:
            at(table, release)  # raises where a release has no value
        # read from the code at a tag, or fitted to the start-up logs where the code was not read
        assert all(entry.source.startswith(("https://github.com/vllm-project/vllm/blob/v",
                                            "calibrated: tests/data/startup-logs/")) for entry in table)


def test_the_pins_are_profiled_releases():
    for dist, pinned in PINS.items():
        assert pinned in PROFILED[dist]
        assert list(PROFILED[dist]) == sorted(PROFILED[dist], key=key)


def test_split_engine():
    assert split_engine("vllm==0.31.0") == ("vllm", "0.31.0")
    assert split_engine("vllm") == ("vllm", None)
    with pytest.raises(InputError):
        split_engine("vllm==")


def test_a_named_release_wins_and_an_unprofiled_one_is_refused():
    assert choose("vllm", "0.31.0", "--engine").why == "named by --engine"
    with pytest.raises(InputError, match="0.25.0 is not a profiled release"):
        choose("vllm", "0.25.0", "--engine")


def test_the_installed_release_is_found_in_kvdoctors_environment(tmp_path, monkeypatch):
    """A real dist-info on sys.path, as pip leaves it: the release is read from the installed metadata."""
    info = tmp_path / "vllm-0.30.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    release = choose("vllm", None, "--engine")
    assert (release.version, release.why) == ("0.30.0", "installed in kvdoctor's environment")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.25.1\n")
    release = choose("vllm", None, "--engine")
    assert release.version == PINS["vllm"] and "0.25.1" in release.why and "not a profiled" in release.why


def check_json(*args: str) -> tuple[int, dict, str]:
    proc = run("check", "--format", "json", "--static", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def test_check_describes_the_named_release_and_says_why():
    rc, doc, _ = check_json(str(GEMMA3), "--engine", "vllm==0.31.0")
    result = doc["results"][0]
    assert result["engine_versions"] == {"vllm": "0.31.0"}
    assert result["info"]["release"] == {"dist": "vllm", "version": "0.31.0", "why": "named by --engine"}
    proc = run("check", "--static", str(GEMMA3), "--engine", "vllm==0.31.0")
    assert "vllm 0.31.0 (named by --engine)" in proc.stdout


def test_an_unprofiled_release_is_one_line_and_exit_2():
    proc = run("check", "--static", str(GEMMA3), "--engine", "vllm==0.25.0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "not a profiled release" in proc.stderr
    proc = run("check", "--static", str(GEMMA3), "--engine", "mlx-lm==0.31.0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_the_deploy_files_engine_version_names_the_release(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: vllm\nengine_version: 0.28.0\n")
    rc, doc, _ = check_json(str(GEMMA3), "--deploy", str(deploy))
    assert doc["results"][0]["engine_versions"] == {"vllm": "0.28.0"}
    assert doc["results"][0]["info"]["release"]["why"] == f"named by engine_version in deploy file {deploy}"
    deploy.write_text("engine: vllm\nengine_version: latest\n")
    proc = run("check", "--static", str(GEMMA3), "--deploy", str(deploy))
    assert proc.returncode == 2 and "engine_version" in proc.stderr and "Traceback" not in proc.stderr


def test_vllm_0_34_sizes_blocks_of_64_and_0_33_of_16():
    """CacheConfig.DEFAULT_BLOCK_SIZE at each tag (goldens/vllm-0.34.0.json holds 0.34.0's own numbers)."""
    blocks = {}
    for release in ("0.33.0", "0.34.0"):
        _, doc, _ = check_json(str(GEMMA3), "--engine", f"vllm=={release}")
        blocks[release] = {g["block_size"] for g in doc["results"][0]["info"]["vllm"]["groups"]}
    assert blocks == {"0.33.0": {16}, "0.34.0": {64}}


def test_sglang_puts_muse_glimmers_sliding_layers_in_their_own_pool_from_0_5_18(muse):
    caches = {}
    for release in ("0.5.17", "0.5.18"):
        _, doc, _ = check_json(str(muse), "--engine", f"sglang=={release}")
        caches[release] = {row["cache"] for row in doc["results"][0]["layers"]}
    assert caches == {"0.5.17": {"full"}, "0.5.18": {"full", "swa"}}


def diff_json(*args: str) -> tuple[int, dict]:
    proc = run("diff", "--format", "json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}


def test_diff_reports_what_an_upgrade_changes_over_a_fleet(muse):
    rc, doc = diff_json(str(GEMMA3), str(QWEN3_NEXT), "--engine", "vllm==0.33.0", "--to", "vllm==0.34.0", "-j", "2")
    assert rc == 0  # warnings only: the default gate fails on errors
    for result in doc["results"]:
        assert result["engine_versions"] == {"vllm": "0.33.0 -> 0.34.0"}
        found = {f["code"]: f for f in result["findings"]}
        assert found["UPG003"]["severity"] == "warning"
        before, after = result["info"]["diff"]["budget_before"], result["info"]["diff"]["budget_after"]
        assert before["mode"]["block_size"] < after["mode"]["block_size"]
        assert result["info"]["diff"]["budget_after"]["capacity"]["kv_budget_bytes"] == 40 << 30
    gemma = {f["code"]: f for f in doc["results"][0]["findings"]}
    assert "block_size 16 -> 64 (26 layers, 0-25)" in gemma["UPG003"]["message"]
    rc, doc = diff_json(str(muse), "--engine", "sglang==0.5.17", "--to", "sglang==0.5.23", "--fail-on", "warning")
    assert rc == 1
    found = {f["code"]: f for f in doc["results"][0]["findings"]}
    assert "cache full -> swa (39 layers" in found["UPG003"]["message"]
    capacity = found["UPG005"]["evidence"]["capacity"]["max_total_num_tokens"]
    assert capacity["after"] > capacity["before"]


def test_diff_finds_a_refusal_the_upgrade_gains():
    """537109 KiB hold one request of Gemma-3-1B at 32768 tokens in 0.33.0's blocks of 16 (549,912,576 bytes
    with the null block) but not in 0.34.0's blocks of 64 (551,288,832): the sliding windows round up to
    whole blocks."""
    rc, doc = diff_json(str(GEMMA3), "--engine", "vllm==0.33.0", "--to", "vllm==0.34.0", "--kv-budget", "537109KiB")
    assert rc == 1
    found = {f["code"]: f for f in doc["results"][0]["findings"]}
    assert found["UPG001"]["severity"] == "error"
    assert "To serve at least one request with the model's max seq len (32768)" in found["UPG001"]["message"]
    assert "UPG004" not in found  # no capacity to compare once a side refuses
    rc, doc = diff_json(str(GEMMA3), "--engine", "vllm==0.34.0", "--to", "vllm==0.33.0", "--kv-budget", "537109KiB")
    assert [f["code"] for f in doc["results"][0]["findings"]].count("UPG002") == 1


def test_diff_compares_two_releases_of_one_engine():
    proc = run("diff", str(GEMMA3), "--engine", "vllm==0.33.0", "--to", "sglang==0.5.23")
    assert proc.returncode == 2 and "one engine" in proc.stderr and "Traceback" not in proc.stderr


def test_vllm_0_26_words_the_promotion_failure_its_own_way(tmp_path):
    """Qwen3-Next with the hybrid manager off: both releases refuse (MEM002), each in its own words
    (vllm/v1/core/kv_cache_utils.py @ v0.26.0 L1519 and @ v0.27.1 L1529)."""
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: vllm\nvllm:\n  disable_hybrid_kv_cache_manager: true\n")
    seen = {}
    for release in ("0.26.0", "0.27.0"):
        _, doc, _ = check_json(str(QWEN3_NEXT), "--deploy", str(deploy), "--engine", f"vllm=={release}",
                               "--select", "MEM002")
        (finding,) = doc["results"][0]["findings"]
        seen[release] = finding["engine_error"]["message"]
    assert seen == {"0.26.0": "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one "
                              "unified type.",
                    "0.27.0": "Failed to promote local KV cache specs to one unified type."}
