"""`kvdoctor fit` as a user runs it (a real process): its JSON, HTML and exit codes, the deploy file, bad
input, and every emitted `vllm serve` command parsed and configured by vLLM's own code where a vLLM
Python is installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, make_model, run

VLLM_PYTHON = Path(os.environ.get("KVDOCTOR_VLLM_PYTHON", "/tmp/ux/venvs/vllm/bin/python"))
# An SGLang venv's Python (`kvdoctor engines install sglang`, or a goldens venv): none is installed by default.
SGLANG_PYTHON = os.environ.get("KVDOCTOR_SGLANG_PYTHON", "")


def _sglang_missing() -> str:
    """Why the SGLang launch test cannot run here ("" when it can)."""
    if not SGLANG_PYTHON or not Path(SGLANG_PYTHON).exists():
        return "no SGLang Python: set KVDOCTOR_SGLANG_PYTHON to an SGLang venv's python"
    proc = subprocess.run([SGLANG_PYTHON, "-c", "import sglang.srt.server_args"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=300)
    return "" if proc.returncode == 0 else f"{SGLANG_PYTHON} cannot import sglang.srt.server_args: " + (
        proc.stderr.strip().splitlines() or ["?"])[-1]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("fit"), "llama-3.1-8b")


def _json(*args: str) -> tuple[int, dict]:
    proc = run("fit", *args, "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_json_rows_terms_and_recommendation(llama: Path) -> None:
    rc, doc = _json(str(llama), "--gpu", "H100-80GB", "--gpus", "2", "--context", "131072", "--concurrency", "12")
    assert doc["schema"] == "kvdoctor.fit/1"
    assert {r["layout"]["tp"] for r in doc["rows"]} == {1, 2}  # tp 2, and tp 1 x pp 2
    row = next(r for r in doc["rows"] if r["layout"]["tp"] == 2)
    terms = {t["name"]: t["bytes"] for t in row["terms"]}
    # the memory left is what the engine's share of the GPU keeps after its reservations (from 0.34.0, the default
    # release, the extensible KV cache's headroom among them)
    assert row["kv_bytes"] == terms["requested"] - terms["weights"] - terms["activations"] - terms["non_torch"] \
        - terms["cuda_graphs"] - terms["reserved"]
    assert terms["weights"] == row["weights"]["bytes_per_rank"]
    assert all(t["source"] for t in row["terms"])
    # 12 requests of 128k do not fit on two GPUs; the recommendation uses more and serves them
    assert rc == 1 and not any(r["fits"] for r in doc["rows"])
    best = doc["recommendation"]
    assert best["gpus"] > 2 and best["max_concurrency"] >= 12
    assert best["launch"][:3] == ["vllm", "serve", str(llama)]


def test_a_context_longer_than_memory_is_refused_with_vllms_text(llama: Path) -> None:
    rc, doc = _json(str(llama), "--gpu", "RTX-4090", "--context", "131072")
    row = doc["rows"][0]
    assert rc == 1
    assert row["refusal"]["class"] == "ValueError"
    assert row["refusal"]["message"].startswith("To serve at least one request with the model's max seq len (131072)")
    assert 0 < row["max_context"] < 131072  # what --max-model-len auto would choose
    # 0.34.0's extensible KV cache advises its own way (after warm-up, at utilization 1.0); 0.33.0 the older way
    assert "The extensible KV cache already takes all device memory left after the model, its activations, CUDA " \
        "graphs and warmup; decrease `max_model_len` or `max_num_seqs`" in row["refusal"]["message"]
    _, old = _json(str(llama), "--engine", "vllm==0.33.0", "--gpu", "RTX-4090", "--context", "131072")
    assert "Try increasing `gpu_memory_utilization` (which also controls CPU memory" in old["rows"][0]["refusal"]["message"]
    assert "extensible" not in old["rows"][0]["refusal"]["message"]


def test_fp8_kv_cache_doubles_the_tokens(llama: Path) -> None:
    _, auto = _json(str(llama), "--gpu", "H100-80GB", "--context", "8192")
    _, fp8 = _json(str(llama), "--gpu", "H100-80GB", "--context", "8192", "--kv-cache-dtype", "fp8")
    a, f = auto["rows"][0], fp8["rows"][0]
    assert a["kv_bytes"] == f["kv_bytes"]
    assert f["kv_tokens"] == pytest.approx(2 * a["kv_tokens"], rel=0.01)
    assert "--kv-cache-dtype" in f["launch"]


def test_gpu_memory_overrides_the_preset(llama: Path) -> None:
    _, doc = _json(str(llama), "--gpu", "H100-80GB", "--gpu-memory", "40GiB", "--context", "8192")
    assert doc["inputs"]["gpu_memory_bytes"] == 40 << 30
    assert doc["inputs"]["gpu_source"] == "--gpu-memory"


def test_deploy_file_gives_layout_context_and_concurrency(llama: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("budget:\n  gpu: H100-80GB\n  context: 32768\n  concurrency: 4\n"
                      "vllm:\n  tensor_parallel_size: 2\n  gpu_memory_utilization: 0.8\n")
    rc, doc = _json(str(llama), "--deploy", str(deploy))
    assert rc == 0
    assert [r["layout"]["tp"] for r in doc["rows"]] == [2]
    row = doc["rows"][0]
    assert row["context"] == 32768 and row["fits"]
    assert "0.8" in row["launch"]


@pytest.mark.parametrize("engine,section", [("vllm", "vllm"), ("sglang", "sglang")])
def test_deploy_file_dtype_prices_float32_weights_and_reaches_the_launch_command(
        llama: Path, tmp_path: Path, engine: str, section: str) -> None:
    def weights(extra: str) -> tuple[int, list[str]]:
        deploy = tmp_path / f"{engine}-{bool(extra)}.yaml"
        deploy.write_text(f"budget:\n  gpu: H200\n  context: 8192\n{section}:\n  {extra or 'dtype: auto'}\n")
        _, doc = _json(str(llama), "--engine", engine, "--deploy", str(deploy))
        row = doc["rows"][0]
        return row["weights"]["bytes_per_rank"], row["launch"]
    half, half_launch = weights("")
    full, full_launch = weights("dtype: float32")
    assert "--dtype" not in half_launch
    assert full_launch[full_launch.index("--dtype") + 1] == "float32"
    assert 1.9 < full / half < 2.1  # the bfloat16 checkpoint served in float32


def test_html_has_a_stacked_bar_per_stage(llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "fit.html"
    proc = run("fit", str(llama), "--gpu", "H100-80GB", "--gpus", "2", "--context", "8192", "--format", "html",
               "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert page.count('class="bar"') >= 3  # tp2: one bar; tp1 x pp2: one per stage
    assert "weights:" in page and "kv:" in page


@pytest.mark.parametrize("args, text", [
    (["--gpu", "H10"], "--gpu 'H10': expected one of"),
    (["--gpu", "H100-80GB", "--engine", "hf"], "--engine"),
    (["--gpu", "H100-80GB", "--gpus", "0"], "--gpus '0'"),
    (["--gpu-memory", "lots"], "--gpu-memory"),
    (["--gpu", "H100-80GB", "--format", "xml"], "--format 'xml'"),
])
def test_bad_input_is_one_line_and_exit_2(llama: Path, args: list[str], text: str) -> None:
    proc = run("fit", str(llama), *args)
    assert proc.returncode == 2
    assert text in proc.stderr and "Traceback" not in proc.stderr


def _vllm_configs(commands: list[list[str]], tmp_path: Path) -> list[dict]:
    """Each command through vLLM's own parser and create_engine_config (tests/vllm_launch_child.py)."""
    listing = tmp_path / "commands.json"
    listing.write_text(json.dumps(commands))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_launch_child.py"), str(listing)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    configs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(configs) == len(commands)
    assert not [(c, r) for c, r in zip(commands, configs) if "error" in r]
    return configs


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM Python installed here")
def test_launch_commands_parse_and_configure_in_vllm(llama: Path, tmp_path: Path) -> None:
    _, doc = _json(str(llama), "--gpu", "H100-80GB", "--gpus", "2", "--context", "65536", "--kv-cache-dtype", "fp8")
    commands = [r["launch"] for r in doc["rows"] if r["launch"]] + [doc["recommendation"]["launch"]]
    configs = _vllm_configs(commands, tmp_path)
    for command, config in zip(commands, configs):
        assert config["tp"] == int(command[command.index("--tensor-parallel-size") + 1])
        assert config["max_model_len"] == 65536
        assert config["kv_cache_dtype"] == "fp8"


def test_api_fit_is_the_commands_document(llama: Path) -> None:
    from kvdoctor import api
    from kvdoctor.errors import InputError

    doc = api.fit(llama, gpu="H100-80GB", gpus=2, context=32768, concurrency=4)
    _, cli = _json(str(llama), "--gpu", "H100-80GB", "--gpus", "2", "--context", "32768", "--concurrency", "4")
    assert doc == cli
    with pytest.raises(InputError, match="--gpu"):
        api.fit(llama, gpu="nope")


def test_sglang_fit_uses_mem_fraction_static_and_its_launcher(llama: Path) -> None:
    _, doc = _json(str(llama), "--engine", "sglang", "--gpu", "H100-80GB", "--gpus", "2", "--context", "32768")
    row = doc["rows"][0]
    terms = {t["name"]: t["bytes"] for t in row["terms"]}
    # SGLang keeps total x (1 - mem_fraction_static) back for activations and graphs; the pools get the rest
    assert row["kv_bytes"] == doc["inputs"]["gpu_memory_bytes"] - terms["reserved"] - terms["weights"] - terms["non_torch"]
    assert row["launch"][:4] == ["python", "-m", "sglang.launch_server", "--model-path"]
    assert "--mem-fraction-static" in row["launch"] and row["launch"][row["launch"].index("--tp-size") + 1] == "2"
    # the pool holds max_total_num_tokens shared by all requests: concurrency is tokens / context
    assert row["max_concurrency"] == pytest.approx(row["kv_tokens"] / 32768)
    _, fixed = _json(str(llama), "--engine", "sglang", "--gpu", "H100-80GB", "--context", "32768")
    deploy_fraction = fixed["rows"][0]["deploy"]["mem_fraction_static"]
    assert 0.8 < deploy_fraction < 0.9


def test_sglang_attention_dp_is_offered_for_mla_models(tmp_path: Path) -> None:
    kimi = make_model(tmp_path, "kimi-linear")
    _, doc = _json(str(kimi), "--engine", "sglang", "--gpu", "H200", "--gpus", "4", "--context", "65536")
    dpa = [r for r in doc["rows"] if r["layout"]["dp_attention"]]
    assert dpa and dpa[0]["layout"]["dp"] == 4 and dpa[0]["gpus"] == 4
    plain = next(r for r in doc["rows"] if r["layout"]["tp"] == 4 and not r["layout"]["dp_attention"]
                 and r["layout"]["ep"] == 1)
    # attention over one rank each: more attention weights per rank than TP 4
    assert dpa[0]["weights"]["bytes_per_rank"] > plain["weights"]["bytes_per_rank"]


def test_mlx_lm_fit_on_unified_memory(llama: Path) -> None:
    rc, doc = _json(str(llama), "--engine", "mlx-lm", "--gpu", "M-series-32GB", "--context", "32768")
    row = doc["rows"][0]
    terms = {t["name"]: t["bytes"] for t in row["terms"]}
    assert rc == 0 and row["fits"]
    assert terms["reserved"] + terms["weights"] + terms["kv"] == 32 << 30  # the working set, less the weights
    assert row["launch"] == ["mlx_lm.server", "--model", str(llama)]
    assert 32768 <= row["max_context"] <= 131072
    rc, small = _json(str(llama), "--engine", "mlx-lm", "--gpu", "M-series-16GB", "--context", "32768")
    assert rc == 1 and small["rows"][0]["refusal"]["message"].startswith("[METAL] Command buffer execution failed")
    proc = run("fit", str(llama), "--engine", "mlx-lm", "--gpu", "M-series-32GB", "--gpus", "2")
    assert proc.returncode == 2 and "no layout of 2 GPU(s)" in proc.stderr


def test_the_recommended_deploy_file_passes_check_and_a_greedier_one_fails(llama: Path, tmp_path: Path) -> None:
    proc = run("fit", str(llama), "--gpu", "H100-80GB", "--context", "131072", "--concurrency", "8")
    assert proc.returncode == 1  # one H100 does not serve it; the recommendation does
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(proc.stdout[proc.stdout.index("engine: vllm"):])
    ok = run("check", "--engine", "vllm", "--static", "--deploy", str(deploy), str(llama), "--format", "json")
    assert ok.returncode == 0, ok.stdout[-2000:]
    assert not [f for f in json.loads(ok.stdout)["results"][0]["findings"] if f["code"] == "MEM016"]
    deploy.write_text(deploy.read_text().replace("concurrency: 8", "concurrency: 64"))
    gate = run("check", "--engine", "vllm", "--static", "--deploy", str(deploy), str(llama), "--format", "json")
    assert gate.returncode == 1
    finding = next(f for f in json.loads(gate.stdout)["results"][0]["findings"] if f["code"] == "MEM016")
    assert "the deploy file asks for 64" in finding["message"]
    assert finding["line"] == 6  # budget.concurrency in the deploy file


def test_tp_that_does_not_divide_the_heads_is_refused_and_kv_heads_replicate(tmp_path: Path) -> None:
    qwen = make_model(tmp_path, "qwen2.5-7b")  # 28 query heads, 4 KV heads
    _, doc = _json(str(qwen), "--gpu", "H100-80GB", "--gpus", "8", "--context", "8192")
    tp8 = next(r for r in doc["rows"] if r["layout"]["tp"] == 8)
    assert tp8["refusal"]["message"] == ("Total number of attention heads (28) must be divisible by tensor parallel "
                                          "size (8).")
    _, doc4 = _json(str(qwen), "--gpu", "H100-80GB", "--gpus", "4", "--context", "8192")
    tp4 = next(r for r in doc4["rows"] if r["layout"]["tp"] == 4)
    assert tp4["refusal"] is None
    _, doc7 = _json(str(qwen), "--gpu", "H100-80GB", "--gpus", "7", "--context", "8192")
    tp7 = next(r for r in doc7["rows"] if r["layout"]["tp"] == 7)
    assert any("exceeds the 4 KV heads" in note for note in tp7["notes"])


def test_budget_reads_the_gpu_preset_of_the_deploy_file(llama: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("budget:\n  gpu: H100-80GB\n  context: 32768\n  engines: [vllm]\n")
    proc = run("budget", str(llama), "--deploy", str(deploy), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["engines"][0]["budget"]["gpu_memory_bytes"] == int(79.18 * (1 << 30))


def test_checks_html_draws_the_rank_of_a_deploy_that_does_not_fit(llama: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("engine: vllm\nbudget:\n  gpu: H100-80GB\n  context: 131072\n  concurrency: 16\n")
    page = tmp_path / "report.html"
    proc = run("check", "--engine", "vllm", "--static", "--deploy", str(deploy), str(llama), "--html-output", str(page))
    assert proc.returncode == 1
    html = page.read_text()
    assert "Memory of the fullest rank (MEM016)" in html
    assert 'class="fit-bar"' in html and 'title="weights: 14.96 GiB"' in html


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no vLLM Python installed here")
def test_moe_pipeline_and_deploy_flags_parse_and_configure_in_vllm(llama: Path, tmp_path: Path) -> None:
    """Expert parallelism (gpt-oss), pipeline stages, and the deploy file's scheduler and eager flags: every
    emitted command is one vLLM 0.33.0 parses and configures with the layout kvdoctor priced."""
    moe = make_model(tmp_path, "gpt-oss-20b")
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("vllm:\n  max_num_seqs: 64\n  max_num_batched_tokens: 4096\n  enforce_eager: true\n"
                      "  gpu_memory_utilization: 0.85\n")
    docs = [_json(str(moe), "--gpu", "H100-80GB", "--gpus", "2", "--context", "32768")[1],
            _json(str(llama), "--gpu", "A100-40GB", "--gpus", "4", "--context", "16384", "--deploy", str(deploy))[1]]
    rows = [r for d in docs for r in d["rows"] if r["launch"]]
    assert any(r["layout"].get("expert_parallel") for r in rows) and any(r["layout"]["pp"] > 1 for r in rows)
    configs = _vllm_configs([r["launch"] for r in rows], tmp_path)
    for row, config in zip(rows, configs):
        assert (config["tp"], config["pp"]) == (row["layout"]["tp"], row["layout"]["pp"])
        assert config["expert_parallel"] == bool(row["layout"].get("expert_parallel"))
        assert config["max_model_len"] == row["context"]
    eager = [c for r, c in zip(rows, configs) if "--enforce-eager" in r["launch"]]
    assert eager and all(c["enforce_eager"] and c["max_num_seqs"] == 64 and c["gpu_memory_utilization"] == 0.85
                         for c in eager)


@pytest.mark.skipif(not SGLANG_PYTHON, reason="no SGLang Python: set KVDOCTOR_SGLANG_PYTHON to an SGLang venv's python")
def test_sglang_launch_commands_parse_and_build_server_args(llama: Path, tmp_path: Path) -> None:
    """Every emitted `python -m sglang.launch_server` command through SGLang's own parser and ServerArgs
    (prepare_server_args): TP, PP, expert parallelism (gpt-oss) and attention DP (an MLA model)."""
    why = _sglang_missing()
    if why:
        pytest.skip(why)
    mla = make_model(tmp_path, json.loads((ROOT / "fixtures/configs/real/deepseek-ai__DeepSeek-V2-Lite.json").read_text()),
                     dirname="deepseek-v2-lite")
    moe = make_model(tmp_path, "gpt-oss-20b")
    docs = [_json(str(m), "--engine", "sglang", "--gpu", "H100-80GB", "--gpus", "2", "--context", "16384",
                  *extra)[1] for m, extra in ((llama, ["--kv-cache-dtype", "fp8"]), (moe, []), (mla, []))]
    rows = [r for d in docs for r in d["rows"] if r["launch"]]
    assert any(r["layout"]["ep"] > 1 for r in rows) and any(r["layout"]["dp_attention"] for r in rows)
    assert any(r["layout"]["pp"] > 1 for r in rows)
    listing = tmp_path / "commands.json"
    listing.write_text(json.dumps([r["launch"] for r in rows]))
    proc = subprocess.run([SGLANG_PYTHON, str(ROOT / "tests" / "sglang_launch_child.py"), str(listing)],
                          capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(rows)
    assert not [(r["launch"], got) for r, got in zip(rows, results) if "error" in got]
    for row, got in zip(rows, results):
        assert (got["tp"], got["pp"], got["ep"]) == (row["layout"]["tp"], row["layout"]["pp"], row["layout"]["ep"])
        assert got["dp_attention"] == row["layout"]["dp_attention"] and got["context_length"] == 16384
        assert got["mem_fraction_static"] == row["deploy"]["mem_fraction_static"]


def test_sglang_fit_without_any_context_length_is_one_line(tmp_path: Path) -> None:
    """A config that states no context length: the engines read its transformers class's default (Gemma-3's
    text_config: 131072; Llama's: 2048), and fit does too; a type with no class (remote code) and no --context
    is a one-line error, not a division by zero (SGLang sizes its request slots by the context)."""
    llama = make_model(tmp_path, "llama-3.1-8b", edit=lambda c: c.pop("max_position_embeddings"))
    proc = run("fit", str(llama), "--engine", "sglang", "--gpu", "H100-80GB", "--gpus", "1", "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["rows"][0]["context"] == 2048  # LlamaConfig's default
    cfg = json.loads((ROOT / "fixtures/configs/fresh/internlm__internlm2_5-7b-chat.json").read_text())
    d = make_model(tmp_path, cfg, edit=lambda c: c.pop("max_position_embeddings"))
    proc = run("fit", str(d), "--engine", "sglang", "--gpu", "H100-80GB", "--gpus", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "states no context length" in proc.stderr and "give --context" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    ok = run("fit", str(d), "--engine", "sglang", "--gpu", "H100-80GB", "--gpus", "1", "--context", "8192")
    assert ok.returncode == 0


# vLLM 0.34.0's own venv (the goldens'): its parser knows --enable-extensible-kv-cache
VLLM034_PYTHON = Path(os.environ.get("KVDOCTOR_VLLM034_PYTHON",
                                     "/work/wt-rel/goldens/.venv/vllm-0.34.0/bin/python"))


def _terms(row: dict) -> dict[str, int]:
    return {t["name"]: t["bytes"] for t in row["terms"]}


def _release_row(llama: Path, release: str, *extra: str) -> dict:
    _, doc = _json(str(llama), "--engine", f"vllm=={release}", "--gpu", "H100-80GB", "--gpus", "1",
                   "--context", "32768", *extra)
    assert doc["inputs"]["release"]["version"] == release
    return next(r for r in doc["rows"] if r["layout"]["tp"] == 1)


def test_vllm_0_33_estimates_and_0_34_measures_the_kv_memory(llama: Path) -> None:
    """0.33.0: 0.92 of the GPU less weights, non-torch memory, activations and CUDA graphs. 0.34.0 (the extensible KV
    cache): all of it, less what the engine holds, the transient (activations plus the CUDA graph estimate again)
    and a margin of max(1 GiB, 0.75 x transient) below the memory free at start-up."""
    from kvdoctor.engines.vllm import fit as vfit

    old, new = _release_row(llama, "0.33.0"), _release_row(llama, "0.34.0")
    total = old["gpu_memory_bytes"]
    a, b = _terms(old), _terms(new)
    for name in ("weights", "activations", "non_torch", "cuda_graphs"):  # the same engine work, priced alike
        assert a[name] == b[name] and a[name] > 0
    assert a["requested"] == -(-total * 92 // 100) and "reserved" not in a
    assert old["kv_bytes"] == a["requested"] - a["weights"] - a["activations"] - a["non_torch"] - a["cuda_graphs"]
    assert "@ 0.33.0" in next(t["source"] for t in old["terms"] if t["name"] == "requested")
    used = b["weights"] + b["non_torch"] + b["cuda_graphs"]
    transient = b["activations"] + b["cuda_graphs"]
    margin = max(1 << 30, int(0.75 * transient))
    assert b["requested"] == total
    assert new["kv_bytes"] == min(total - used, total - vfit.START_UP_USED[0] - used - margin) - transient
    assert new["kv_bytes"] == b["requested"] - used - b["activations"] - b["reserved"]  # the terms add up
    sources = {t["name"]: t["source"] for t in new["terms"]}
    assert "extensible_kv_cache.py:64-65" in sources["reserved"] and "@ 0.34.0" in sources["kv"]
    assert "config/cache.py:495-501" in sources["requested"]
    # this GPU and model: the measured sizing leaves more than 0.92's estimate, and serves more at 32k
    assert new["kv_bytes"] > old["kv_bytes"] and new["max_concurrency"] > old["max_concurrency"]
    assert "--gpu-memory-utilization" in old["launch"]
    assert "--gpu-memory-utilization" not in new["launch"] and "gpu_memory_utilization" not in new["deploy"]


def test_vllm_0_34_without_the_extensible_cache_is_0_92_again(llama: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "off.yaml"
    deploy.write_text("vllm:\n  enable_extensible_kv_cache: false\n")
    old, off = _release_row(llama, "0.33.0"), _release_row(llama, "0.34.0", "--deploy", str(deploy))
    assert _terms(off) == _terms(old) and off["kv_bytes"] == old["kv_bytes"]
    assert "--no-enable-extensible-kv-cache" in off["launch"] and "--gpu-memory-utilization" not in off["launch"]
    assert off["deploy"]["enable_extensible_kv_cache"] is False
    # a utilization given caps the measured sizing at that share of the GPU, and reaches the launch command
    deploy.write_text("vllm:\n  gpu_memory_utilization: 0.8\n")
    capped = _release_row(llama, "0.34.0", "--deploy", str(deploy))
    t = _terms(capped)
    assert t["requested"] == -(-capped["gpu_memory_bytes"] * 8 // 10)
    assert capped["kv_bytes"] == t["requested"] - t["weights"] - t["non_torch"] - 2 * t["cuda_graphs"] - t["activations"]
    assert capped["launch"][capped["launch"].index("--gpu-memory-utilization") + 1] == "0.8"
    # before 0.34.0 there is no such cache, nor a flag for it
    deploy.write_text("vllm:\n  enable_extensible_kv_cache: false\n")
    proc = run("fit", str(llama), "--engine", "vllm==0.33.0", "--gpu", "H100-80GB", "--deploy", str(deploy))
    assert proc.returncode == 2 and "no extensible KV cache" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not VLLM034_PYTHON.exists(), reason="no vLLM 0.34.0 Python installed here")
def test_vllm_0_34_launch_commands_parse_and_configure(llama: Path, tmp_path: Path, monkeypatch) -> None:
    deploy = tmp_path / "off.yaml"
    deploy.write_text("vllm:\n  enable_extensible_kv_cache: false\n  gpu_memory_utilization: 0.85\n")
    rows = [_release_row(llama, "0.34.0"), _release_row(llama, "0.34.0", "--deploy", str(deploy))]
    monkeypatch.setattr(sys.modules[__name__], "VLLM_PYTHON", VLLM034_PYTHON)
    default, off = _vllm_configs([r["launch"] for r in rows], tmp_path)
    assert default["gpu_memory_utilization"] is None  # vLLM resolves it by the sizing mode
    assert off["gpu_memory_utilization"] == 0.85 and off["enable_extensible_kv_cache"] is False
