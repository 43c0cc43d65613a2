"""SGLang check oracle: an SGLang release's own CUDA-path start-up decisions per config, mutation and setting.

Run with the SGLang oracle venv (see README.md):

    goldens/.venv/sglang/bin/python goldens/sglang_check_oracle.py          # all, rewrites sglang_check.json
    KVDOCTOR_GOLDEN_MODELS=openai__gpt-oss-20b ... sglang_check_oracle.py    # some models, for debugging
    ... sglang_check_oracle.py --configs DIR --out FILE   # the *.json configs of DIR only (a held-out set)
    ... sglang_check_oracle.py --configs 'DIR/sglang_*.json' --out FILE   # the configs a pattern names
    ... sglang_check_oracle.py --configs DIR --out FILE --more-settings   # plus the settings of MORE_SETTINGS
    python sglang_check_oracle.py --merge FILE...   # a held-out set's points into sglang_check.json
    python sglang_check_oracle.py --merge-into GOLDEN FILE...   # a rerun's points into another goldens file

Every stage is the dry run's child's own (kvdoctor/engines/sglang/startup.py: one implementation, called here in
the order the goldens record), and every decision comes from SGLang's code: `ServerArgs(...).resolve_once()` (backend, page size, Mamba
cache strategy, validation), `ModelConfig.from_server_args` (attention arch, hybrid-SWA allow-list,
SWA / full layer ids, Mamba / GDN / KDA state params), `resolve_sliding_window_size` on a bare instance
of the registered model class, `resolve_layer_indices`, `configure_kv_cache_dtype`, a real
`KVCacheConfigurator` (`_handle_max_mamba_cache`, `config_from_budget`, `resolve_max_num_reqs`; at 0.5.15, which
has none, the same steps on `ModelRunner` through the adapter's `RunnerSizing`) at a
40 GiB budget, and `_init_pools` at tiny sizes on the CPU device for the pool classes, buffer shapes and
layer-id -> buffer maps. The platform is CUDA: `kvdoctor/engines/sglang/shims/cudafake.py` makes
torch report H200s and `fakemods.py` beside it makes CUDA-only extension packages importable; no kernel
runs. What the script
states itself: the 40 GiB budget (SGLang profiles it on the GPU), `attn_tp_size` (no process groups).

Each model runs in a fork of one child process that imported SGLang once (SGLang keeps process-wide state);
its points run in sequence in the fork. `KVDOCTOR_CHECK_GRID=release` runs the per-release grid (each unmutated
config at the default settings, TP 8 and fp8 KV; goldens/releases.py --check sglang==X) in the release's venv,
whose API `kvdoctor/engines/sglang/shims/sglang_api.py` adapts to (the dry run's child adapts through it too).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIMS = HERE.parent / "kvdoctor" / "engines" / "sglang" / "shims"
sys.path[:0] = [str(HERE), str(SHIMS)]

from common import CONFIGS, only_models  # noqa: E402

REAL = HERE.parent / "fixtures" / "configs" / "real"
BUDGET_GIB = 40.0
TINY_TOKENS = 256
SETTINGS_KEYS = ("tp_size", "context_length", "page_size", "kv_cache_dtype", "disable_hybrid_swa_memory",
                 "swa_full_tokens_ratio", "mamba_ssm_dtype")


# ---------------------------------------------------------------- cases (pure, no SGLang)

def text_of(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def is_hybrid_state(cfg: dict) -> bool:
    text = text_of(cfg)
    types = text.get("layer_types") or []
    return bool(any(t in ("linear_attention", "mamba", "conv") for t in types) or text.get("hybrid_override_pattern")
                or text.get("linear_attn_config") or text.get("mamba_d_ssm") or text.get("mamba_n_heads"))


def mutations(cfg: dict) -> dict[str, dict | None]:
    """name -> mutated config (None: the mutation does not apply to this config)."""
    out: dict[str, dict | None] = {"none": cfg}
    text = text_of(cfg)
    n = text.get("num_hidden_layers")
    types = text.get("layer_types")

    def edit(fn):
        new = copy.deepcopy(cfg)
        fn(text_of(new))
        return new

    if types:
        out["layer_types_shifted"] = edit(lambda t: t.__setitem__("layer_types", t["layer_types"][1:] + t["layer_types"][:1]))
        out["layer_types_truncated"] = edit(lambda t: t.__setitem__("layer_types", t["layer_types"][:-1]))
        out["layer_types_missing"] = edit(lambda t: t.pop("layer_types"))
        out["mtp_appended"] = edit(lambda t: t.__setitem__("layer_types", t["layer_types"] + [t["layer_types"][-1]]))
        kinds = set(types)
        attn = [k for k in kinds if "attention" in k and k != "linear_attention"]
        out["all_sliding"] = edit(lambda t: t.__setitem__(
            "layer_types", ["sliding_attention" if x in attn else x for x in t["layer_types"]]))
    else:
        out["layer_types_shifted"] = out["layer_types_truncated"] = out["layer_types_missing"] = None
        out["mtp_appended"] = None
        out["all_sliding"] = (edit(lambda t: t.__setitem__("layer_types", ["sliding_attention"] * n))
                              if n and text.get("sliding_window") else None)
    out["sliding_window_null"] = edit(lambda t: t.__setitem__("sliding_window", None)) if "sliding_window" in text else None

    def window_no_types(t):
        t.pop("layer_types", None)
        t["sliding_window"] = t.get("sliding_window") or 4096
    out["window_no_layer_types"] = edit(window_no_types)
    return out


CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def model_context(cfg: dict) -> int:
    """The context length the config states, in the key order SGLang reads (utils/hf_transformers/common.py)."""
    text = text_of(cfg)
    return int(next((text[k] for k in CONTEXT_KEYS if text.get(k)), 32768))


# Settings the default grid lacks, for held-out sets (--more-settings): other TP sizes, a page size FA3 takes,
# the other fp8 KV format, a request cap, a smaller chunked prefill, and a context shorter than the model's.
MORE_SETTINGS = {"tp2": {"tp_size": 2}, "tp4": {"tp_size": 4}, "page_size_16": {"page_size": 16},
                 "fp8_e5m2_kv": {"kv_cache_dtype": "fp8_e5m2"}, "max_running_requests_64": {"max_running_requests": 64},
                 "chunked_prefill_4096": {"chunked_prefill_size": 4096}}
MORE = False  # set by --more-settings


def settings_grid(cfg: dict) -> dict[str, dict]:
    text = text_of(cfg)
    limit = model_context(cfg)
    grid = {"default": {}, "disable_hybrid_swa_memory": {"disable_hybrid_swa_memory": True},
            "swa_full_tokens_ratio_0.25": {"swa_full_tokens_ratio": 0.25},
            "context_length_2x": {"context_length": 2 * limit}, "tp8": {"tp_size": 8},
            "fp8_kv": {"kv_cache_dtype": "fp8_e4m3"}, "page_size_64": {"page_size": 64}}
    if is_hybrid_state(cfg):
        current = text.get("mamba_ssm_dtype") or "float32"
        grid["mamba_ssm_dtype"] = {"mamba_ssm_dtype": "bfloat16" if current == "float32" else "float32"}
    if MORE:
        grid.update(MORE_SETTINGS)
        grid["context_length_half"] = {"context_length": limit // 2}
    return grid


# The per-release grid (KVDOCTOR_CHECK_GRID=release, goldens/releases.py --check sglang==X): each unmutated
# config at the default settings, at TP 8 and with fp8 KV.
GRID = os.environ.get("KVDOCTOR_CHECK_GRID", "full")
RELEASE_SETTINGS = {"default": {}, "tp8": {"tp_size": 8}, "fp8_kv": {"kv_cache_dtype": "fp8_e4m3"}}


def cases(cfg: dict) -> list[dict]:
    """Every mutation with default settings, and every setting on the unchanged config (GRID "release": the
    unchanged config under RELEASE_SETTINGS)."""
    if GRID == "release":
        return [{"mutation": "none", "setting": name, "settings": settings, "config": cfg}
                for name, settings in RELEASE_SETTINGS.items()]
    out = []
    for name, mutated in mutations(cfg).items():
        if mutated is not None:
            out.append({"mutation": name, "setting": "default", "settings": {}, "config": mutated})
        else:
            out.append({"mutation": name, "setting": "default", "settings": {}, "config": None})
    for name, settings in settings_grid(cfg).items():
        if name != "default":
            out.append({"mutation": "none", "setting": name, "settings": settings, "config": cfg})
    return out


def corpus(configs: Path | None = None) -> dict[str, Path]:
    if configs is not None:  # a folder's *.json, or a pattern (goldens/heldout-rel/sglang_*.json)
        found = configs.glob("*.json") if configs.is_dir() else configs.parent.glob(configs.name)
        return {p.stem: p for p in sorted(found) if "_check-" not in p.name}  # not a goldens file beside them
    files = {p.stem: p for p in sorted(CONFIGS.glob("*.json"))}
    files.update({p.name: p / "config.json" for p in sorted(CONFIGS.iterdir()) if (p / "config.json").is_file()})
    if REAL.is_dir():
        files.update({p.stem: p for p in sorted(REAL.glob("*.json"))})
    wanted = only_models()
    return {k: v for k, v in files.items() if not wanted or k in wanted}


# ---------------------------------------------------------------- one point (child process, SGLang)

def _startup():
    """kvdoctor/engines/sglang/startup.py, the dry run's child, loaded by path: its stages are the ones this
    oracle runs (one implementation; importing it as part of the kvdoctor package would need kvdoctor's own
    dependencies in the SGLang venv)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_startup", SHIMS.parent / "startup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


startup = _startup()


def _error(exc: BaseException) -> dict:
    def where(f):
        return f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" if f else None

    sglang_frame, last = startup.raised_at(exc)
    return {"class": type(exc).__name__, "message": str(exc), "raised_at_sglang": where(sglang_frame),
            "raised_at": where(last)}


@functools.cache
def _native_archs() -> frozenset[str]:
    """The architectures this venv's SGLang model registry serves natively: its modules' EntryClass names, read as
    tools/sglang_registry.py reads them (not kvdoctor/data/sglang_registry.json's, which are the default release's:
    an older release lacks some, e.g. 0.5.16 has no Qwen3_5MoeForCausalLM)."""
    import sglang

    sys.path.insert(0, str(HERE.parent / "tools"))
    from sglang_registry import entry_classes

    return frozenset(entry_classes(Path(sglang.__file__).parent / "srt" / "models"))


# What the goldens record of startup.py's rows (the dry run's rows carry more)
MODEL_KEYS = ("architectures", "model_class", "attention_arch", "is_hybrid_swa", "is_hybrid_swa_model",
              "swa_attention_layer_ids", "full_attention_layer_ids", "sliding_window_size", "runner_sliding_window_size",
              "attention_chunk_size", "num_hidden_layers", "num_attention_layers", "context_len", "dtype", "head_dim",
              "num_attention_heads", "num_kv_heads_tp1", "num_kv_heads_tp", "kv_lora_rank", "qk_rope_head_dim",
              "v_head_dim", "quantization", "layer_types")
STATE_CONFIGS = ("mambaish_config", "hybrid_gdn_config", "hybrid_kda_config")  # hybrid_kda_config from 0.5.21


def run_point(model_dir: Path, settings: dict) -> dict:
    """startup.py's stages in the order the goldens record them: the model decisions before the architecture
    check, every stage's refusal as data, and the tiny pools built even after a sizing error."""
    import cudafake

    cudafake.install(devices=max(1, settings.get("tp_size", 1)))
    out: dict = {"outcome": "ok", "stages": {}}
    stage = "server_args"
    os.environ.pop("SGLANG_MAMBA_SSM_DTYPE", None)
    try:
        sa, out["resolved_server_args"] = startup.server_args(model_dir, settings)
        stage = "model_config"
        mc = startup.model_config(sa)
        model, window = startup.model_window(mc, settings.get("tp_size", 1))
        out["model"] = {k: model[k] for k in MODEL_KEYS}
        stage = "model_arch"  # load_model resolves the model class before any pool (model_loader/utils.py:230)
        startup.model_arch(mc, _native_archs())
        stage = "layer_info"
        layers = startup.layer_indices(mc)
        out["layer_info"] = startup.layer_row(layers, mc)
        stage = "configurator"
        kvc, kv_dtype = startup.configurator(sa, mc, window, layers)
        state = {name: None if getattr(kvc, name) is None else type(getattr(kvc, name)).__name__
                 for name in STATE_CONFIGS if hasattr(kvc, name)}
        if kvc.mambaish_config is not None:
            state["mamba2_cache_params"] = startup.cache_params_row(kvc.mambaish_config.mamba2_cache_params)
        out["state"] = state
        out["kv_cache_dtype"] = startup._dtype(kv_dtype)
    except Exception as exc:  # noqa: BLE001 - every start-up refusal is data here
        out.update(outcome="refused", refused_at=stage, error=_error(exc))
        return out

    try:  # sizing at a fixed budget (stands in for the GPU profile)
        row = startup.sizing(kvc, int(BUDGET_GIB * (1 << 30)))
        out["sizing_40GiB"] = {"budget_gib": BUDGET_GIB, **{k: v for k, v in row.items() if k != "budget_bytes"}}
    except Exception as exc:  # noqa: BLE001
        out.update(outcome="sizing_error", error=_error(exc))

    try:  # the real pool classes at tiny sizes on the CPU device
        _, row = startup.build_pools(mc, kvc, TINY_TOKENS)
        out["pools_tiny"] = {k: v for k, v in row.items() if k != "placements"}
        out["stages"]["pools_tiny"] = "ok"
    except Exception as exc:  # noqa: BLE001
        out["stages"]["pools_tiny"] = _error(exc)
    return out


class _Records:
    """Collects WARNING+ log records of one point (SGLang's own warnings are part of its answer)."""

    def __init__(self):
        import logging

        self.items: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda r: self.items.append(f"{r.name}: {r.getMessage()}")
        logging.getLogger().addHandler(handler)

    def take(self) -> list[str]:
        items = [i for i in self.items if "Ignore import error" not in i and "pynvml" not in i
                 and "nvidia-smi" not in i]
        self.items.clear()
        return sorted(set(items))


def child(cases_path: Path) -> None:
    """Each model's cases (`cases_path`: model -> cases) in a fork of this process, which imported SGLang once:
    SGLang keeps process-wide state, so every model starts from the state after the import."""
    import logging
    import warnings

    sys.path.insert(0, str(HERE / "stubs"))
    sys.path.append(str(HERE / ".venv-extra"))  # uvicorn, fastapi, setproctitle: imported by some model modules
    import cudafake
    import fakemods

    cudafake.install()
    fakemods.install()
    warnings.simplefilter("ignore")
    logging.getLogger().setLevel(logging.WARNING)
    import sglang.srt.server_args  # noqa: F401 - imported once, before the forks

    for model, todo in json.loads(cases_path.read_text()).items():
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                model_points(model, todo, _Records())
                code = 0
            except BaseException:  # noqa: BLE001 - the parent marks the missing points as a crash
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        os.waitpid(pid, 0)


def model_points(model: str, todo: list[dict], records: _Records) -> None:
    root = Path(tempfile.mkdtemp(prefix="kvdoctor-sgl-check-"))
    for i, case in enumerate(todo):
        if case["config"] is None:
            result = {"outcome": "not_applicable"}
        else:
            d = root / f"{i}"
            d.mkdir()
            (d / "config.json").write_text(json.dumps(case["config"]))
            started = time.time()
            result = run_point(d, case["settings"])
            result["seconds"] = round(time.time() - started, 2)
            result["warnings"] = records.take()
        print("POINT " + json.dumps({"model": model, "mutation": case["mutation"], "setting": case["setting"],
                                     "settings": case["settings"], "config": case["config"], "result": result}),
              flush=True)


def run_all(configs: Path | None = None, out: Path | None = None) -> None:
    todo = {name: cases(json.loads(path.read_text())) for name, path in corpus(configs).items()}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(todo, f)
    started = time.time()
    got: dict[str, list[dict]] = {name: [] for name in todo}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", f.name], stdout=subprocess.PIPE, stderr=err,
                                text=True)
        for line in proc.stdout or ():
            if line.startswith("POINT "):
                point = json.loads(line[6:])
                got[point["model"]].append(point)
                if len(got[point["model"]]) == len(todo[point["model"]]):
                    print(f"{point['model']}: {len(todo[point['model']])} points, {time.time() - started:.0f}s",
                          flush=True)
        proc.wait()
        err.seek(0)
        tail = err.read()[-2000:]
    points = []
    for name, cases_of in todo.items():
        for case in cases_of[len(got[name]):]:
            got[name].append({"model": name, "mutation": case["mutation"], "setting": case["setting"],
                              "settings": case["settings"], "result": {"outcome": "crash", "stderr_tail": tail}})
        points += got[name]
    version = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    doc = {"schema": "kvdoctor.goldens.sglang_check/1", "engine": "sglang", "versions": {"sglang": version},
           "grid": GRID,
           "platform": "cuda (torch.cuda reports NVIDIA H200 sm90; shims/cudafake.py)", "budget_gib": BUDGET_GIB,
           "configs": [os.path.relpath(configs, HERE.parent)] if configs else ["fixtures/models", "fixtures/configs/real"],
           "points": points}
    out = out or HERE / "sglang_check.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({len(points)} points)")


def merge(files: list[Path], golden: Path = HERE / "sglang_check.json") -> None:
    """Take held-out sets' points into sglang_check.json (or `golden`): a model's points replace any it had; the
    file's other points stay as they are."""
    doc = json.loads(golden.read_text())
    for path in files:
        new = json.loads(path.read_text())
        assert new["versions"] == doc["versions"], (path, new["versions"])
        models = {p["model"] for p in new["points"]}
        doc["points"] = [p for p in doc["points"] if p["model"] not in models] + new["points"]
        doc["configs"] = sorted(set(doc["configs"]) | set(new["configs"]))
    golden.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {golden} ({len(doc['points'])} points)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "--merge":
        merge([Path(a) for a in sys.argv[2:]])
    elif len(sys.argv) > 3 and sys.argv[1] == "--merge-into":
        merge([Path(a) for a in sys.argv[3:]], Path(sys.argv[2]))
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "--configs" and sys.argv[3] == "--out":
        MORE = sys.argv[5:] == ["--more-settings"]
        run_all(Path(sys.argv[2]), Path(sys.argv[4]))
    else:
        run_all()
