"""Agreement of kvdoctor's static SGLang plan with an SGLang check oracle file, row by row.

    PYTHONPATH=. .venv/bin/python tools/sglang_agreement.py goldens/sglang_check.json [more.json[.gz] ...] [--misses]

The file is what `goldens/sglang_check_oracle.py --configs DIR --out FILE` writes (an SGLang release's own
start-up per config x mutation x setting; the profile is planned at the release the file records). The rows are
the ones issue 43 reports:

- outcome: start, or the same refusal (class and exact text); a sizing error counts as a start-up that
  SGLang's configurator refuses, and an error SGLang's own pool build raises after the sizing as a start-up
  refusal, as tests/test_sglang_cuda.py holds them;
- pool and index: every layer's (pool, buffer index), the pool classes and the per-token buffer shapes and
  dtypes (and the Mamba / GDN state shapes), on points where SGLang built its pools;
- window: attention arch, hybrid-SWA decision, SWA / full layer ids and the runner's window;
- sizing: full / SWA pool tokens, state slots and max running requests at 40 GiB.

A point kvdoctor cannot read (InputError) counts as a miss on every row it has. `--misses` lists each miss
with a short reason.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from golden_text import sets_sorted  # noqa: E402
from kvdoctor.engines.sglang.layout import plan_layers  # noqa: E402
from kvdoctor.engines.sglang.settings import SglangSettings  # noqa: E402
from kvdoctor.errors import InputError  # noqa: E402
from kvdoctor.load.loader import load_model  # noqa: E402
from kvdoctor.model import GDN, MAMBA  # noqa: E402

ROWS = ("outcome", "pool and index", "window", "sizing 40GiB")
ORACLE_DIR = re.compile(r"/tmp/kvdoctor-sgl-check-[^/\s]+/\d+")  # the folder the oracle gave SGLang


def as_planned_for(message: str, model_dir: Path) -> str:
    """SGLang's text with the oracle's model folder replaced by the one kvdoctor was given."""
    return ORACLE_DIR.sub(str(model_dir), message)


def golden_placements(pools: dict) -> dict[int, tuple[str, int]]:
    """Layer id -> (pool, buffer index) as SGLang's own pool objects map them (tests/test_sglang_cuda.py too)."""
    kv = pools["token_to_kv_pool"]
    attn = "mla" if (kv.get("full_kv_pool") or kv)["class"] in ("MLATokenToKVPool", "DSATokenToKVPool") else "full"
    if kv["class"] == "DeepSeekV4TokenToKVPool":  # each layer's window KV lives in its SWA sub-pool, by layer id
        return {kv["start_layer"] + i: ("swa", i) for i in range(kv["layer_num"])}
    if "layers_mapping" in kv:
        return {int(k): ("swa" if is_swa else "full", i) for k, (i, is_swa) in kv["layers_mapping"].items()}
    if "full_attention_layer_id_mapping" in kv:
        out = {int(k): (attn, i) for k, i in kv["full_attention_layer_id_mapping"].items()}
        out.update({int(k): ("mamba", i) for k, i in (pools["mamba_pool"] or {}).get("mamba_map", {}).items()})
        return out
    return {kv["start_layer"] + i: (attn, i) for i in range(kv["layer_num"])}


def _pools_differ(spec, layers, facts, want: dict, tp: str) -> str | None:
    pools = want["pools_tiny"]
    got = {l.index: (l.extra["pool"], l.extra["pool_index"]) for l in layers if "pool" in l.extra}
    expect = golden_placements(pools)
    if got != expect:
        wrong = sorted(set(got.items()) ^ set(expect.items()))[:3]
        return f"placements differ ({len(got)} planned, {len(expect)} built), e.g. {wrong}"
    if facts.pools.get("token_to_kv_pool") != pools["token_to_kv_pool"]["class"]:
        return f"kv pool class {facts.pools.get('token_to_kv_pool')} != {pools['token_to_kv_pool']['class']}"
    if facts.pools.get("req_to_token_pool") != pools["req_to_token_pool"]:
        return f"req pool class {facts.pools.get('req_to_token_pool')} != {pools['req_to_token_pool']}"
    top = pools["token_to_kv_pool"]
    for sub, mine in (("full_kv_pool", "attention_buffer_per_token"), ("swa_kv_pool", "swa_buffer_per_token")):
        kv = top.get(sub) or (top if sub == "full_kv_pool" else None)
        if kv is None or not any(name in kv for name in ("k_buffer", "kv_buffer")):
            continue
        buffer = facts.pools.get(mine) or {}
        for name in ("k_buffer", "v_buffer", "kv_buffer"):
            if name in kv and (buffer.get(name) != kv[name][0]["shape"][1:] or buffer.get("dtype") != kv[name][0]["dtype"]):
                return f"{sub}.{name} {buffer.get(name)} {buffer.get('dtype')} != {kv[name][0]['shape'][1:]} {kv[name][0]['dtype']}"
    if spec.kinds() & {GDN, MAMBA}:
        state = next((l.state for l in layers if l.state), None)
        mamba = pools.get("mamba_pool") or {}
        for name in ("conv", "temporal"):
            if not state or tp not in state or name not in mamba:
                return f"state {name}: planned {bool(state)}, built {name in mamba}"
            if state[tp][name]["shape"] != mamba[name][0]["shape"][2:] or state[tp][name]["dtype"] != mamba[name][0]["dtype"]:
                return f"state {name} {state[tp][name]} != {mamba[name][0]}"
    return None


def _window_differs(facts, want: dict) -> str | None:
    model = want["model"]
    ids = lambda v: None if v is None else tuple(v)  # noqa: E731
    pairs = (("attention_arch", facts.attention_arch, model["attention_arch"]),
             ("hybrid_swa", facts.hybrid_swa, model["is_hybrid_swa"]),
             ("swa_layer_ids", facts.swa_layer_ids, ids(model["swa_attention_layer_ids"])),
             ("full_layer_ids", facts.full_layer_ids, ids(model["full_attention_layer_ids"])),
             ("runner_window", facts.runner_sliding_window, model["runner_sliding_window_size"]),
             ("kv_cache_dtype", facts.kv_cache_dtype, want["kv_cache_dtype"]))
    for name, got, expect in pairs:
        if got != expect:
            return f"{name}: {str(got)[:60]} != {str(expect)[:60]}"
    return None


def _sizing_differs(budget: dict | None, want: dict) -> str | None:
    if not budget or "error" in budget or "not_priced" in budget:
        return f"no budget: {str(budget)[:120]}"
    if want["swa_max_total_num_tokens"] is not None:
        expect = {"full": want["full_max_total_num_tokens"], "swa": want["swa_max_total_num_tokens"]}
    else:
        expect = {"full": want["max_total_num_tokens"]}
    if budget.get("pools") != expect:
        return f"pools {budget.get('pools')} != {expect}"
    if budget.get("max_running_requests") != want["max_running_requests"]:
        return f"max_running_requests {budget.get('max_running_requests')} != {want['max_running_requests']}"
    if "max_mamba_cache_size" in want:
        state = budget.get("state") or {}
        if (state.get("slots"), state.get("slots_per_request")) != (want["max_mamba_cache_size"], want["mamba_ratio"]):
            want_state = f"{want['max_mamba_cache_size']}/{want['mamba_ratio']}"
            return f"state {state.get('slots')}/{state.get('slots_per_request')} != {want_state}"
    return None


def judge(point: dict, work: Path, release: str | None = None) -> dict[str, str | None]:
    """Row -> None (agrees) or the reason it does not, for the rows this point has, with the profile at
    `release` (the file's own; None: the default one)."""
    want = point["result"]
    rows: dict[str, str | None] = {"outcome": None}
    built = want["outcome"] == "ok" and want.get("stages", {}).get("pools_tiny") == "ok"
    if want["outcome"] == "ok":
        rows["window"] = None
    if built:
        rows["pool and index"] = None
    if "sizing_40GiB" in want:
        rows["sizing 40GiB"] = None
    (work / "config.json").write_text(json.dumps(point["config"]))
    try:
        spec = load_model(str(work), with_checkpoint=False)
        settings = SglangSettings(**point["settings"]).at_release(release)
        layers, refusals, facts = plan_layers(spec, settings)
        budget = plan_layers(spec, SglangSettings(**point["settings"], kv_budget="40GiB").at_release(release))[2] \
            .budget if "sizing_40GiB" in want else None
    except (InputError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        return {row: f"kvdoctor cannot read it: {str(exc).splitlines()[0][:140]}" for row in rows}
    except Exception as exc:  # noqa: BLE001 - an internal error is a miss to report, not a crash of the tool
        return {row: f"kvdoctor crashed: {type(exc).__name__}: {str(exc)[:140]}" for row in rows}
    if want["outcome"] in ("refused", "sizing_error"):
        expect = (want["error"]["class"], sets_sorted(as_planned_for(want["error"]["message"], work)))
        got = (refusals[0].error_class, sets_sorted(refusals[0].message)) if refusals else None
        if want["outcome"] == "sizing_error" and not refusals:
            got = None
        if got != expect:
            rows["outcome"] = f"SGLang {expect[0]}: {expect[1][:100]!r}; kvdoctor {got and (got[0], got[1][:100])}"
        if want["outcome"] == "sizing_error":
            rows.pop("sizing 40GiB", None)
        return rows
    failed = want.get("stages", {}).get("pools_tiny")
    if isinstance(failed, dict) and failed.get("raised_at_sglang"):  # sized, then SGLang's own pool build raised
        # (a start-up refusal after the sizing; an error of the oracle's host or of kvdoctor's code is not SGLang's)
        got = (refusals[0].error_class, refusals[0].message) if refusals else None
        if got != (failed["class"], failed["message"]):
            rows["outcome"] = f"SGLang's pool build {failed['class']}: {failed['message'][:100]!r}; kvdoctor {got}"
        rows["window"] = _window_differs(facts, want)
        if "sizing 40GiB" in rows:
            rows["sizing 40GiB"] = _sizing_differs(budget, want["sizing_40GiB"])
        return rows
    if refusals:
        rows["outcome"] = f"SGLang starts; kvdoctor predicts {refusals[0].error_class}: {refusals[0].message[:100]!r}"
        return {row: rows["outcome"] for row in rows}
    rows["window"] = _window_differs(facts, want)
    if built:
        rows["pool and index"] = _pools_differ(spec, layers, facts, want, str(point["settings"].get("tp_size", 1)))
    if "sizing 40GiB" in rows:
        rows["sizing 40GiB"] = _sizing_differs(budget, want["sizing_40GiB"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--misses", action="store_true", help="list every miss with its reason")
    args = parser.parse_args()
    totals = {row: collections.Counter() for row in ROWS}
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.files:
            raw = path.read_bytes()  # a measured file may be stored gzipped (a config of megabytes per point)
            doc = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
            for point in doc["points"]:
                if point["result"]["outcome"] in ("not_applicable", "crash"):
                    continue
                for row, why in judge(point, Path(tmp), doc["versions"]["sglang"]).items():
                    totals[row]["agree" if why is None else "miss"] += 1
                    if why is not None:
                        misses.append((row, f"{point['model']} {point['mutation']} {point['setting']}", why))
    for row in ROWS:
        n = totals[row]["agree"] + totals[row]["miss"]
        print(f"{row:16s} {totals[row]['agree']}/{n}" + (f" ({100 * totals[row]['agree'] / n:.1f}%)" if n else ""))
    if args.misses:
        for row, where, why in misses:
            print(f"MISS [{row}] {where}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
