"""vLLM check oracle: what vLLM 0.33.0's own start-up code decides for a config and its deploy settings.

Run in goldens/.venv/vllm with VLLM_TARGET_DEVICE=cpu (see README.md). Per point, all of it vLLM's code:
1. `EngineArgs(model=DIR, load_format="dummy", skip_tokenizer_init=True, **settings).create_engine_config()`;
2. the model class instantiated on the meta device under that config (`initialize_model`), the executor's
   `update_block_size_for_backend` and `validate_block_size`, then the worker's `get_kv_cache_spec`
   (each attention / Mamba layer's own `get_kv_cache_spec`);
3. the engine core's `resolve_kv_cache_layout`, `get_global_kv_cache_groups` and `get_kv_cache_configs`
   (admission check) against the point's KV budget (40 GiB unless the point sets one).
What the script supplies: the mutated config.json, a single-process gloo group (faked to TP world size
8 for `tp8` on rank 0), and one recorded workaround per CPU-only obstacle (see README.md). The point
runner is kvdoctor/engines/vllm/startup.py, which `--dry-run` runs as its child; this file adds the
corpus, the mutations and the settings grid.

`python vllm_check_oracle.py` runs every model in a child process each and writes vllm_check.json;
`python vllm_check_oracle.py --model NAME OUT.json` runs one model and writes its points to OUT.json.
`KVDOCTOR_CHECK_CONFIGS=DIR[:DIR...]` takes the configs from those folders instead (a held-out set kept
outside the repo) and `KVDOCTOR_CHECK_OUT=FILE.json` writes the points there instead of vllm_check.json.
`KVDOCTOR_CHECK_MORE_SETTINGS=1` adds, on the unmutated config, `block_size` 32, `max_num_batched_tokens`
2048 (chunked prefill) and ngram speculation with 3 tokens (held-out set 8); `=2` also set 9's settings.
`KVDOCTOR_CHECK_GRID=release` runs the per-release grid (goldens/releases.py --check): the unmutated
configs under `default`, and under `hma_off` where the layers' specs differ (or the default point refused before
they were built), each model in a fork of one process that imported vLLM once.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "stubs"))  # transformers' image processors import torchvision at module level

from common import CONFIGS, GiB, load_startup, write  # noqa: E402

REAL = HERE.parent / "fixtures" / "configs" / "real"
FRESH = HERE.parent / "fixtures" / "configs" / "fresh"  # held-out sets 7 and 8, merged after they were measured
BUDGET = 40 * GiB
DEFAULT_WINDOW = 4096  # the window a mutation adds where the config has none
GRID = os.environ.get("KVDOCTOR_CHECK_GRID", "full")  # "release": the per-release grid (see the docstring)


# --- the corpus and its mutations (plain JSON edits of config.json) -------------------------------

def folders() -> list[Path]:
    chosen = [Path(d).resolve() for d in os.environ.get("KVDOCTOR_CHECK_CONFIGS", "").split(os.pathsep) if d]
    return chosen or [CONFIGS, REAL, FRESH]


def corpus() -> dict[str, dict]:
    out = {}
    for folder in folders():
        for path in sorted(folder.iterdir()):
            if path.name.startswith(("vllm_check-", "sglang_check-")):  # a held-out folder keeps each release's points
                continue
            src = path / "config.json" if path.is_dir() else path
            if src.suffix == ".json" and src.exists():
                out[path.stem if path.is_file() else path.name] = json.loads(src.read_text())
    return out


def text_of(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def max_position(cfg: dict) -> int:
    return int(text_of(cfg).get("max_position_embeddings") or 131072)


ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def mutations(cfg: dict) -> dict[str, dict]:
    """The issue's config mutations that mean something for this config (name -> mutated copy)."""
    text = text_of(cfg)
    types = text.get("layer_types")
    window = text.get("sliding_window")
    out = {"none": cfg}
    if GRID == "release":
        return out

    def edit(fn) -> dict:
        new = copy.deepcopy(cfg)
        fn(text_of(new))
        return new

    if isinstance(types, list) and types:
        out["layer_types_shifted"] = edit(lambda t: t.update(layer_types=types[1:] + types[:1]))
        out["layer_types_truncated"] = edit(lambda t: t.update(layer_types=types[:-1]))
        out["layer_types_missing"] = edit(lambda t: t.pop("layer_types"))
        extra = int(text.get("num_nextn_predict_layers") or 1)
        out["mtp_appended"] = edit(lambda t: t.update(layer_types=types + [types[-1]] * extra))
    if window is not None:
        out["sliding_window_null"] = edit(lambda t: t.update(sliding_window=None))

    def window_only(t: dict) -> None:
        t.pop("layer_types", None)
        t["sliding_window"] = window or DEFAULT_WINDOW

    out["window_no_layer_types"] = edit(window_only)

    def all_sliding(t: dict) -> None:
        n = int(t.get("num_hidden_layers") or len(t.get("layers_block_type") or types or []))
        old = types if isinstance(types, list) and len(types) == n else ["full_attention"] * n
        t["layer_types"] = ["sliding_attention" if k in ATTENTION_TYPES else k for k in old]
        t["sliding_window"] = window or DEFAULT_WINDOW

    out["all_sliding"] = edit(all_sliding)
    return out


def settings_for(cfg: dict, hybrid: bool) -> dict[str, dict]:
    """The issue's deploy settings (name -> EngineArgs keyword arguments)."""
    out = {"default": {}, "hma_off": {"disable_hybrid_kv_cache_manager": True}}
    if GRID == "release":
        return out
    out |= {"len2x": {"max_model_len": 2 * max_position(cfg)}, "tp8": {"tensor_parallel_size": 8},
           "fp8": {"kv_cache_dtype": "fp8"}}
    if hybrid:
        out["prefix_caching"] = {"enable_prefix_caching": True}
    if os.environ.get("KVDOCTOR_CHECK_MORE_SETTINGS"):  # set 8's additions: page size, chunked prefill, speculation
        out.update(block32={"block_size": 32}, chunked2k={"max_num_batched_tokens": 2048},
                   ngram3={"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    if os.environ.get("KVDOCTOR_CHECK_MORE_SETTINGS") == "2":  # set 9's: TP 2 / 4, prefix caching off, block 64,
        # a short max_model_len, fp8 KV with HMA off, chunked prefill off, MTP speculation where the config has layers
        out.update(tp2={"tensor_parallel_size": 2}, tp4={"tensor_parallel_size": 4},
                   no_prefix={"enable_prefix_caching": False}, block64={"block_size": 64},
                   len4k={"max_model_len": 4096}, fp8_hma_off={"kv_cache_dtype": "fp8",
                                                               "disable_hybrid_kv_cache_manager": True},
                   no_chunked={"enable_chunked_prefill": False, "max_model_len": 4096})
        if text_of(cfg).get("num_nextn_predict_layers"):
            out["mtp1"] = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
    return out


def extra_points(name: str, cfg: dict) -> list[tuple[str, dict, str, dict, int]]:
    """Points for refusals the grid does not reach: (mutation, config, setting, engine args, KV budget)."""
    out: list[tuple[str, dict, str, dict, int]] = []
    if GRID == "release":
        return out
    if text_of(cfg).get("model_type") == "qwen2":  # a window on the upper layers only
        partial = copy.deepcopy(cfg)
        text_of(partial).update(use_sliding_window=True, sliding_window=4096,
                                max_window_layers=text_of(cfg)["num_hidden_layers"] // 2)
        out.append(("qwen2_partial_window", partial, "default", {}, BUDGET))
    if text_of(cfg).get("kv_lora_rank"):  # an MLA model with the plain nvfp4 KV layout
        out.append(("none", cfg, "nvfp4", {"kv_cache_dtype": "nvfp4"}, BUDGET))
    if text_of(cfg).get("hidden_act") == "situ" and (text_of(cfg).get("linear_attn_config") or {}).get("kda_layers"):
        # Kimi-K3: no CPU MoE backend takes its `situ` experts ("No Unquantized MoE backend supports the
        # deployment configuration."), so every grid point is CPU-only; with `silu` (the MLP's activation never
        # enters a KV spec) vLLM builds it and its KDA / MLA layout can be compared
        silu = copy.deepcopy(cfg)
        text_of(silu)["hidden_act"] = "silu"
        out.append(("moe_act_silu", silu, "default", {}, BUDGET))
    if text_of(cfg).get("model_type") == "falcon_h1" and "mamba_d_ssm" not in text_of(cfg):
        # Megatron-Bridge's Falcon-H1-0.5B config has no mamba_d_ssm, so FalconH1Config's default (1024) fails its
        # own validation at every grid point; the bridge's export writes heads x head_dim, which vLLM builds
        sized = copy.deepcopy(cfg)
        text_of(sized)["mamba_d_ssm"] = text_of(cfg)["mamba_n_heads"] * text_of(cfg)["mamba_d_head"]
        out.append(("mamba_d_ssm_from_heads", sized, "default", {}, BUDGET))
    if name == "meta-llama__Llama-3.1-8B":  # budgets below one request, and below one block
        out.append(("none", cfg, "kv_budget_4gib", {}, 4 * GiB))
        out.append(("none", cfg, "kv_budget_256kib", {}, 256 << 10))
    return out


# --- one point: vLLM's start-up up to KV planning (kvdoctor/engines/vllm/startup.py, the dry run's child) ---

startup = load_startup()


def run_point(cfg: dict, kwargs: dict, root: Path, budget: int = BUDGET) -> dict:
    return startup.run_point(cfg, kwargs, root, budget)


def spec_kinds(point: dict) -> set[tuple]:
    """The distinct layer specs of a point (class, window, chunk): HMA off promotes or refuses only where there are
    several; a point refused before its layers were built counts as several (it is run under HMA off too)."""
    layers = point.get("layers")
    if not layers:
        return {("unknown",), ("refused",)}
    return {(l["spec"], l.get("window"), l.get("attention_chunk_size")) for l in layers}


def run_model(name: str) -> list[dict]:
    root = Path(tempfile.mkdtemp(prefix="kvdoctor-vllm-check-"))
    startup.setup(root)
    cfg = corpus()[name]
    points = []
    for mutation, mutated in mutations(cfg).items():
        base = run_point(mutated, {}, root)
        hybrid = bool(base.get("fields", {}).get("is_hybrid")) or any(
            l["spec"] == "MambaSpec" for l in base.get("layers") or [])
        wanted = settings_for(mutated, hybrid) if mutation == "none" else {"default": {}, "hma_off": {
            "disable_hybrid_kv_cache_manager": True}}
        if GRID == "release" and len(spec_kinds(base)) < 2:  # HMA off changes nothing where every layer's spec is one
            wanted.pop("hma_off")
        for setting, kwargs in wanted.items():
            point = base if setting == "default" else run_point(mutated, kwargs, root)
            points.append({"model": name, "mutation": mutation, "setting": setting, "engine_args": kwargs,
                           "kv_budget_bytes": BUDGET, "config": mutated, **point})
            print(f"{name} {mutation} {setting}: "
                  f"{'start' if point['outcome']['start'] else point['outcome']['class']}", file=sys.stderr, flush=True)
    for mutation, mutated, setting, kwargs, budget in extra_points(name, cfg):
        point = run_point(mutated, kwargs, root, budget)
        points.append({"model": name, "mutation": mutation, "setting": setting, "engine_args": kwargs,
                       "kv_budget_bytes": budget, "config": mutated, **point})
    return points


def in_fork(name: str, out: Path) -> int:
    """One model in a fork of this process, which imported vLLM once (GRID "release"); the fork's exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            sys.path.append(str(HERE / ".venv-extra" / "vllm"))
            out.write_text(json.dumps(run_model(name)))
            code = 0
        except BaseException:  # noqa: BLE001 - reported by the parent
            traceback.print_exc()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def in_child(name: str, out: Path) -> int:
    proc = subprocess.run([sys.executable, __file__, "--model", name, str(out)], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--model":  # vLLM logs to stdout: the points go to a file
        Path(sys.argv[3]).write_text(json.dumps(run_model(sys.argv[2])))
        return
    # vLLM inspects model classes in a subprocess, which needs the stubs and mistral_common too
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE / "stubs"), str(HERE / ".venv-extra" / "vllm"), os.environ.get("PYTHONPATH")]))
    run = in_child
    if GRID == "release":  # numpy's BLAS threads (started on import) stop around a fork; any other thread forbids one
        import numpy  # noqa: F401

        before = len(os.listdir("/proc/self/task"))
        startup.preload({})
        run = in_fork if len(os.listdir("/proc/self/task")) == before else in_child
    import torch
    import transformers
    import vllm

    wanted = set(filter(None, os.environ.get("KVDOCTOR_GOLDEN_MODELS", "").split(",")))
    points = []
    target = Path(os.environ.get("KVDOCTOR_CHECK_OUT") or HERE / "vllm_check.json")
    previous = target
    if wanted and previous.exists():  # a partial run keeps the other models' points
        points = [p for p in json.loads(previous.read_text())["points"] if p["model"] not in wanted]
    for name in corpus():
        if wanted and name not in wanted:
            continue
        out = Path(tempfile.mkdtemp()) / "points.json"
        if run(name, out):
            raise SystemExit(f"{name}: the oracle child failed")
        points += json.loads(out.read_text())
        print(name, len(points), flush=True)
    versions = {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                "python": sys.version.split()[0], "platform": "cpu (VLLM_TARGET_DEVICE=cpu)",
                "stand_ins": "no-op torch.cuda.Stream/Event; VLLM_KIMI_K3_GEMM_AR=0; gloo group (TP world size 8 "
                             "faked for tp8); meta current_device while the model is built; CPU_MLA block check skipped; "
                             "CPU_ATTN fp8 ISA check skipped; Mamba state storage as on a host without AVX-512 BF16; "
                             "x86 triton-cpu check passed (0.34.0 on); missing vllm._C op handles are placeholders (up to "
                             "0.32 layers look them up while built); fa_utils' compile_flash_attn_varlen_func_from_specs None on the "
                             "CPU as on XPU / ROCm and a placeholder MLA prefill kernel (0.28.0); vLLM read as a CPU build "
                             "while the platform resolves (0.26.0); see README.md"}
    if target != HERE / "vllm_check.json":
        target.write_text(json.dumps({"schema": "kvdoctor.goldens/1", "engine": "vllm", "versions": versions,
                                      "grid": GRID, "configs": sorted({os.path.relpath(p, HERE.parent)
                                                                       for p in folders()}),
                                      "points": points}, indent=1))
        return
    write("vllm_check", "vllm", versions, points)


if __name__ == "__main__":
    main()
