"""One reading of the engine option (issue 42): `budget`, `fit`, `check`, `config`, `diff --to` and the API take
ENGINE==RELEASE alike, size or price that release, say which and why, and refuse a bad value in one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import make_model, run

from kvdoctor.engines.pins import PINS
from kvdoctor.engines.releases import parse_engine
from kvdoctor.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
GEMMA3 = ROOT / "fixtures" / "models" / "google__gemma-3-1b-it"
GOLDENS = {"0.33.0": ROOT / "goldens" / "vllm.json", "0.34.0": ROOT / "goldens" / "vllm-0.34.0.json"}


def golden_point(release: str) -> dict:
    """Gemma-3-1B at 4 GiB, max_model_len 4096, vLLM's defaults: the point that release's own code measured."""
    points = json.loads(GOLDENS[release].read_text())["points"]
    return next(p for p in points if p["model"] == "google__gemma-3-1b-it" and p["settings"]["hma"]
                and p["settings"]["kv_budget_bytes"] == 4 * 2**30 and p["settings"]["kv_cache_dtype"] == "auto"
                and p["settings"]["tp"] == 1 and p["settings"]["num_speculative_tokens"] == 0
                and p["settings"]["max_num_batched_tokens"] == 8192 and p["settings"]["prefix_caching"]
                and p["settings"]["max_model_len"] == 4096)


def test_parse_engine_reads_name_and_release_for_each_command():
    assert parse_engine("vllm==0.31.0") == ("vllm", "0.31.0")
    assert parse_engine("all", "budget") == ("all", None)
    assert parse_engine("sglang==0.5.18", "fit", "--to") == ("sglang", "0.5.18")
    with pytest.raises(InputError, match="unknown engine 'hf'; expected one of: vllm, sglang, mlx-lm, all"):
        parse_engine("hf", "budget")
    with pytest.raises(InputError, match="a release belongs to one engine"):
        parse_engine("all==0.34.0", "budget")
    with pytest.raises(InputError, match="--to 'vllm==': expected ENGINE or ENGINE==RELEASE"):
        parse_engine("vllm==", "check", "--to")


@pytest.mark.parametrize("release", sorted(GOLDENS))
def test_budget_sizes_the_named_release_as_its_own_code_does(release):
    proc = run("budget", str(GEMMA3), "--engine", f"vllm=={release}", "--kv-budget", "4GiB", "--context", "4096",
               "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["inputs"]["releases"] == {"vllm": {"dist": "vllm", "version": release, "why": "named by --engine"}}
    [row] = doc["engines"]
    want = golden_point(release)["result"]
    assert row["version"] == release
    assert [(g["spec"], g["layers"], g["block_size"], g["page_bytes"]) for g in row["groups"]] == \
        [(g["spec"], g["layers"], g["block_size"], g["page_bytes"]) for g in want["groups"]]
    assert (row["pool"]["num_blocks"], row["pool"]["bytes_per_block"]) == (want["num_blocks"], want["bytes_per_block"])


def test_budget_of_every_engine_says_which_release_each_is_sized_at():
    proc = run("budget", str(GEMMA3), "--kv-budget", "4GiB", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    shown = doc["inputs"]["releases"]
    assert set(shown) == {"vllm", "sglang"}  # mlx-lm describes one release
    assert {row["engine"]: row["version"] for row in doc["engines"] if row["engine"] in shown} == \
        {name: r["version"] for name, r in shown.items()}


def test_the_api_budget_takes_a_release():
    from kvdoctor.api import budget

    doc = budget(GEMMA3, engine="vllm==0.33.0", kv_budget="4GiB", context=4096)
    assert {row["version"] for row in doc["engines"]} == {"0.33.0"}
    assert doc["engines"][0]["pool"]["num_blocks"] == golden_point("0.33.0")["result"]["num_blocks"]


def test_fit_prices_the_named_release(tmp_path):
    """vLLM 0.34.0's default block (64, CacheConfig.DEFAULT_BLOCK_SIZE) and 0.33.0's (16) reach fit's KV plan."""
    llama = make_model(tmp_path, "llama-3.1-8b")
    seen = {}
    for engine in ("vllm==0.33.0", "vllm==0.34.0", "vllm"):
        proc = run("fit", str(llama), "--engine", engine, "--gpu", "H100-80GB", "--context", "131072",
                   "--format", "json")
        assert proc.returncode in (0, 1), proc.stderr
        doc = json.loads(proc.stdout)
        seen[engine] = doc
        assert {row["version"] for row in doc["rows"]} == {doc["inputs"]["release"]["version"]}
    assert seen["vllm==0.33.0"]["inputs"]["release"]["why"] == "named by --engine"
    tokens = {e: d["rows"][0]["kv_tokens"] for e, d in seen.items()}
    assert tokens["vllm==0.33.0"] % 16 == 0 and tokens["vllm==0.34.0"] % 64 == 0
    assert tokens["vllm==0.33.0"] != tokens["vllm==0.34.0"]
    if seen["vllm"]["inputs"]["release"]["version"] == PINS["vllm"]:  # no vLLM installed beside kvdoctor
        assert tokens["vllm"] == tokens[f"vllm=={PINS['vllm']}"]


@pytest.mark.parametrize("command, args, says", [
    ("budget", ["--engine", "vllm==0.25.0"], "vllm 0.25.0 is not a profiled release"),
    ("budget", ["--engine", "all==0.34.0"], "a release belongs to one engine"),
    ("budget", ["--engine", "vllm=="], "expected ENGINE or ENGINE==RELEASE"),
    ("fit", ["--engine", "vllm==0.25.0", "--gpu", "H100-80GB"], "vllm 0.25.0 is not a profiled release"),
    ("fit", ["--engine", "hf", "--gpu", "H100-80GB"], "unknown engine 'hf'; expected one of: vllm, sglang"),
    ("fit", ["--engine", "mlx-lm==0.32.2", "--gpu", "H100-80GB"], "mlx-lm describes one release only"),
    ("check", ["--static", "--engine", "vllm==0.25.0"], "vllm 0.25.0 is not a profiled release"),
    ("diff", ["--engine", "vllm==0.33.0", "--to", "nope==1.0"], "--to: unknown engine 'nope'"),
])
def test_a_bad_engine_option_is_one_line_and_exit_2(command, args, says):
    proc = run(command, str(GEMMA3), *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert says in line, line
