"""`kvdoctor fit` against real start-up logs (tests/data/startup-logs/*.yaml): each log's prediction next to
what the engine printed, and the table of docs/fit.md.

A log gives the engine, its version, the GPU, the settings as passed and the memory figures printed; the
model's published config.json lies in configs/ORG__NAME/. Its checkpoint is synthesized from that config
(kvdoctor.load.synth: the real tensor names and shapes of its family, quantized as its
quantization_config says), so the weights are priced as the engine stores them.

Usage: `python tests/fit_logs.py` prints the table; `--write` puts it into docs/fit.md between its markers;
`--summary` prints how many logs meet each of issue 40's bounds, per part (calibration, validation, held-out: the
set collected after the last calibration and scored before any change it prompted; fresh: a second such set, collected
after the fixes the first one prompted; fresh2: a third, collected after the fresh set's fixes; fresh3: a fourth,
collected after fresh2's; fresh4: a fifth, collected after fresh3's), the refusals fit
predicts among the logs whose engine refused, and for the logs collected after the last calibration (their
`collected_after_calibration` field).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "startup-logs"
DOC = ROOT / "docs" / "fit.md"
BEGIN, END = "<!-- fit-logs:begin -->", "<!-- fit-logs:end -->"
GIB = 1 << 30
# The engines' flags as a log passes them that fit reads (the rest are the engine's defaults at that version).
SETTING_KEYS = ("gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "enforce_eager",
                "enable_prefix_caching", "mem_fraction_static", "chunked_prefill_size", "max_running_requests",
                "disable_cuda_graph", "dtype", "quantization")

sys.path.insert(0, str(ROOT))


def logs() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, yaml.safe_load(p.read_text())) for p in sorted(CORPUS.glob("*.yaml"))]


def _quantize(layout: dict, config: dict) -> None:
    """Store the synthesized tensors as the config's quantization_config says the published ones are."""
    q = config.get("quantization_config") or {}
    method = q.get("quant_method")
    skip = tuple(q.get("modules_to_not_convert") or q.get("ignored_layers") or q.get("ignore") or ())
    stored = _compressed_tensors_dtype(q) if method == "compressed-tensors" else None
    for name, (_dtype, shape) in list(layout.items()):
        linear = name.endswith("proj.weight") and ".layers." in name and not any(s in name for s in skip)
        if not linear or len(shape) != 2:
            continue
        out, inp = shape
        if method == "fp8":
            layout[name] = ("F8_E4M3", shape)
            block = q.get("weight_block_size") or [128, 128]
            layout[name[:-len("weight")] + "weight_scale_inv"] = ("F32", [-(-out // block[0]), -(-inp // block[1])])
        elif stored:  # one 8-bit weight per element and one scale per output channel
            layout[name] = (stored, shape)
            layout[name[:-len("weight")] + "weight_scale"] = ("BF16", [out, 1])
        elif method == "mxfp4" and ".experts." in name:
            del layout[name]
            base = name[:-len(".weight")]
            layout[base + "_blocks"] = ("U8", [out, inp // 32, 16])
            layout[base + "_scales"] = ("U8", [out, inp // 32])


def _compressed_tensors_dtype(q: dict) -> str | None:
    """The safetensors dtype of a compressed-tensors checkpoint's linear weights: 8-bit channel-wise schemes
    (W8A8 FP8 in `float-quantized`, W8A8 INT8 in `int-quantized`) store one byte a weight; others are not laid out."""
    weights = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
    if len(weights) != 1 or weights[0].get("num_bits") != 8 or weights[0].get("strategy") != "channel":
        return None
    return {"float": "F8_E4M3", "int": "I8"}.get(weights[0].get("type"))


def model_dir(tmp: Path, model: str) -> Path | None:
    """The model's config and a sparse checkpoint of its tensors; None when the config is not stored."""
    import json

    from kvdoctor.load.synth import layout_for, write_checkpoint

    src = CORPUS / "configs" / model.replace("/", "__") / "config.json"
    if not src.exists():
        return None
    d = tmp / model.replace("/", "__")
    if not (d / "model.safetensors.index.json").exists() and not any(d.glob("*.safetensors")):
        d.mkdir(parents=True, exist_ok=True)
        config = json.loads(src.read_text())
        (d / "config.json").write_text(json.dumps(config))
        layout = layout_for(d)
        _quantize(layout, config)
        write_checkpoint(d, layout)
    return d


def predict(log: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """fit's figures for one log, and the same KV plan fed the available memory the log printed."""
    from kvdoctor.engines import profile
    from kvdoctor.engines.budget.fit import Request, gpu
    from kvdoctor.errors import InputError
    from kvdoctor.load.loader import load_model

    out: dict[str, Any] = {}
    try:
        d = model_dir(tmp, log.get("config_model") or log["model"])
    except KeyError as exc:  # kvdoctor.load.synth cannot lay the checkpoint out from this config
        return {"skip": f"checkpoint not synthesized: the config has no {exc}"}
    if d is None:
        return {"skip": "config not stored"}
    from kvdoctor.engines import fit_engines
    from kvdoctor.engines.budget.fit import layout_of

    if log["engine"] not in fit_engines():
        return {"skip": f"{log['engine']}: no fit model"}
    s = log["settings"]
    layout = layout_of(s) or {"tp": 1, "pp": 1, "dp": 1}
    settings = {k: v for k, v in s.items() if k in SETTING_KEYS}
    kv_dtype = s.get("kv_cache_dtype") if s.get("kv_cache_dtype") not in (None, "auto") else None
    try:
        spec = load_model(str(d))
        prof = profile(log["engine"])
        facts = prof.budget_facts(spec)
        request = Request(context=s.get("max_model_len") or s.get("context_length"), kv_cache_dtype=kv_dtype)
        card = gpu(None, str(int(log['gpu_memory_gib'] * GIB))) if log.get("gpu_memory_gib") else gpu(log["gpu"])
        row = prof.fit(spec, facts, card, layout, request, {**settings, "version": log["version"]})
        out["refusal"] = row.refusal.message if row.refusal is not None else None
        if not log.get("kv_only"):  # kv_only: the stored config is not the checkpoint served (a quantized copy)
            out["weights_gib"] = row.weights.bytes_per_rank / GIB
            out["available_kv_gib"] = row.kv_bytes / GIB
            out["kv_tokens"] = row.kv_tokens
        observed = available_kv(log)
        if isinstance(observed, (int, float)) and observed > 0:
            given = prof.fit(spec, facts, card, layout, request,
                             {**settings, "version": log["version"], "kv_budget": int(observed * GIB)})
            out["kv_tokens_given_kv"] = given.kv_tokens
    except InputError as exc:  # the scratch copy's path varies from run to run: the table names the model
        return {"skip": str(exc).replace(f"{tmp}/", "")}
    return out


def available_kv(log: dict[str, Any]) -> float | None:
    """The KV memory a log printed, in GiB: vLLM's "Available KV cache memory", or SGLang's K and V sizes
    (its "GB" are 2^30 bytes) where it prints no total."""
    obs = log["observed"]
    if obs.get("available_kv_gib") is not None:
        return obs["available_kv_gib"]
    if log["engine"] == "sglang" and obs.get("k_size_gb") is not None:
        return obs["k_size_gb"] + obs.get("v_size_gb", 0)
    if log["engine"] == "sglang":  # MLA pools print one "KV size"
        return obs.get("kv_size_gb")
    return None


def pool_tokens(log: dict[str, Any]) -> int | None:
    """SGLang's pool: max_total_num_tokens, or the "#tokens" of its "KV Cache is allocated" line."""
    if log["engine"] != "sglang":
        return None
    return log["observed"].get("max_total_num_tokens") or log["observed"].get("kv_tokens")


def error(predicted: float | None, observed: Any) -> float | None:
    if predicted is None or not isinstance(observed, (int, float)) or isinstance(observed, bool) or not observed:
        return None
    return (predicted - observed) / observed


def rows() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="kvdoctor-fit-logs-") as name:
        tmp = Path(name)
        out = []
        for stem, log in logs():
            p = predict(log, tmp)
            obs = log["observed"]
            out.append({"log": stem, "part": log["part"], "engine": log["engine"], "version": log["version"],
                        "skip": p.get("skip"), "refused": bool(obs.get("refused")),
                        "refusal": p.get("refusal"),
                        "weights": (p.get("weights_gib"), obs.get("weights_gib"), error(p.get("weights_gib"),
                                                                                       obs.get("weights_gib"))),
                        "kv": (p.get("available_kv_gib"), available_kv(log),
                               error(p.get("available_kv_gib"), available_kv(log))),
                        "tokens": (p.get("kv_tokens_given_kv"), obs.get("kv_tokens"),
                                   error(p.get("kv_tokens_given_kv"), obs.get("kv_tokens"))),
                        "pool": (p.get("kv_tokens") if log["engine"] == "sglang" else None,
                                 pool_tokens(log),
                                 error(p.get("kv_tokens") if log["engine"] == "sglang" else None,
                                       pool_tokens(log)))})
        return out


def _cell(value: tuple) -> str:
    predicted, observed, err = value
    if err is None:
        return "-" if observed is None else f"(obs. {observed})"
    fmt = (lambda v: f"{v:,.0f}") if isinstance(observed, int) and observed > 1000 else (lambda v: f"{v:.2f}")
    return f"{fmt(predicted)} / {fmt(observed)} ({100 * err:+.1f}%)"


def table(data: list[dict[str, Any]]) -> str:
    lines = ["| log | part | weights GiB: fit / log | available KV GiB: fit / log | KV tokens given the log's KV "
             "| SGLang pool tokens: fit / log |", "|---|---|---|---|---|---|"]
    for r in data:
        if r["skip"]:
            lines.append(f"| `{r['log']}` | {r['part']} | not predicted: {r['skip']} | | | |")
            continue
        lines.append(f"| `{r['log']}` | {r['part']} | {_cell(r['weights'])} | {_cell(r['kv'])} | {_cell(r['tokens'])} "
                     f"| {_cell(r['pool'])} |")
    return "\n".join(lines) + "\n"


def share_within(data: list[dict[str, Any]], key: str, bound: float, part: str | None = None) -> tuple[int, int]:
    """(logs within `bound`, logs with both figures) for `key`, in one part or all."""
    errs = [r[key][2] for r in data if r[key][2] is not None and (part is None or r["part"] == part)]
    return sum(1 for e in errs if abs(e) <= bound), len(errs)


BOUNDS = (("weights", 0.02, "weights per rank within 2%"), ("kv", 0.05, "available KV within 5%"),
          ("tokens", 0.02, "KV tokens within 2% given the logged KV memory"),
          ("pool", 0.05, "SGLang pool tokens within 5%"))


def summary(data: list[dict[str, Any]]) -> str:
    late = {stem for stem, log in logs() if log.get("collected_after_calibration")}
    groups = [("calibration", [r for r in data if r["part"] == "calibration"]),
              ("validation", [r for r in data if r["part"] == "validation"]),
              ("held-out", [r for r in data if r["part"] == "held-out"]),
              ("fresh held-out", [r for r in data if r["part"] == "fresh"]),
              ("third held-out (fresh2)", [r for r in data if r["part"] == "fresh2"]),
              ("fourth held-out (fresh3)", [r for r in data if r["part"] == "fresh3"]),
              ("fifth held-out (fresh4)", [r for r in data if r["part"] == "fresh4"]), ("all", data),
              ("collected after the last calibration", [r for r in data if r["log"] in late])]
    lines = [f"{len(data)} logs, {sum(1 for r in data if not r['skip'])} predicted"]
    for name, group in groups:
        cells = []
        for key, bound, label in BOUNDS:
            within, counted = share_within(group, key, bound)
            cells.append(f"{label}: {within}/{counted}")
        refused = [r for r in group if r["refused"] and not r["skip"]]
        cells.append(f"refusals predicted: {sum(1 for r in refused if r['refusal'])}/{len(refused)}")
        lines.append(f"{name} ({len(group)} logs): " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def main() -> None:
    data = rows()
    if "--summary" in sys.argv:
        print(summary(data), end="")
        return
    text = table(data)
    if "--write" in sys.argv:
        doc = DOC.read_text()
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
