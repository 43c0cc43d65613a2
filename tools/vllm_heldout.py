"""Compare the vLLM profile with a held-out set's oracle points (goldens/vllm_check_oracle.py's output).

    KVDOCTOR_CHECK_CONFIGS=DIR KVDOCTOR_CHECK_OUT=/tmp/set.json VLLM_TARGET_DEVICE=cpu \
        goldens/.venv/vllm/bin/python goldens/vllm_check_oracle.py
    PYTHONPATH=. .venv/bin/python tools/vllm_heldout.py /tmp/set.json [--misses]

Prints the rows docs/vllm.md reports per set: points that agree on every compared field, then the
start-up outcome, the per-layer KV specs (points where vLLM built specs) and the KV cache groups (points
where it built groups), each as agreeing / compared, and the points of a model class the profile leaves to
`--dry-run` at that release (specs.not_planned, VLM024), whose specs are not compared. The fields are those
tests/test_vllm_profile.py holds the goldens to; refusals only a CPU raises, and a venv's
transformers lacking a name vLLM imports (`environment`), are not compared. `--misses` lists each miss.
The profile is planned at the release the points file records. `--merge` then appends the points that agree to
goldens/vllm_check.json when they are that file's release (0.33.0), else to goldens/vllm_heldout-<release>.json
(points already there are left as they are), where tests/test_vllm_profile.py holds the profile to them.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

from golden_text import sets_sorted
from kvdoctor.engines.vllm.profile import plan
from kvdoctor.engines.vllm.settings import VllmSettings
from kvdoctor.engines.vllm.refusals import VERSION
from kvdoctor.engines.vllm.specs import not_planned
from kvdoctor.load.loader import load_model

SLIDING = ("SlidingWindowSpec", "SlidingWindowMLASpec")


def _inner(outcome: dict) -> str:
    text = outcome.get("message") or ""
    if outcome.get("class") == "ValidationError" and re.search(r"\n  (Value error|Assertion failed), ", text):
        text = re.split(r"\n  (?:Value error|Assertion failed), ", text, maxsplit=1)[1].rsplit(" [type=", 1)[0]
    return text


def _norm(text: str, root: str) -> str:
    text = text.replace(root, "DIR")
    text = re.sub(r"/tmp/kvdoctor-vllm-check-[\w/-]+", "DIR", text)  # the oracle's scratch folder
    return re.sub(r"\d+(\.\d+)?", "N", sets_sorted(text))  # a set prints in hash order: members sorted


def _layer(name: str) -> int:
    """The layer index of a KV cache name: `model.layers.3.self_attn.attn`, `3.attn` where a release's model class
    names its attention without the stack (OLMo-2 and GPT-BigCode in 0.30.0), or `model.attn.3` (Zamba2's shared
    attention; the oracle's index is None for the last two)."""
    return int(re.search(r"(?:^|\.)(\d+)(?:\.|$)", name).group(1))  # type: ignore[union-attr]


def cpu_scheduler(point: dict, args: dict) -> dict:
    """The CPU box runs an MLA model with chunked prefill off, max_num_batched_tokens at max_model_len and no async
    scheduling (platforms/cpu.py:532-546 and :347 at 0.34.0), which sizes sliding-window caches (DeepSeek-V4's);
    the profile plans the CUDA defaults, so it is given what the oracle's scheduler ran with."""
    fields = point.get("fields") or {}
    tokens = fields.get("max_num_batched_tokens")
    if fields.get("use_mla") and tokens and tokens != args.get("max_num_batched_tokens"):
        return {**args, "max_num_batched_tokens": tokens, "async_scheduling": False}
    return args


def compare(point: dict, scratch: Path, release: str | None = None) -> dict[str, str | None]:
    """Each compared field -> None (agrees), a short reason (differs); absent: not compared."""
    model = scratch / point["model"] / f"{point['mutation']}-{point['setting']}"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(point["config"]))
    out: dict[str, str | None] = {}
    try:
        spec = load_model(str(model), library_check=False)
        args = cpu_scheduler(point, point.get("engine_args_effective", point["engine_args"]))
        got = plan(spec, VllmSettings(kv_budget=point["kv_budget_bytes"], **args).at_release(release))
    except Exception as exc:  # noqa: BLE001 - a held-out config kvdoctor cannot read is a miss, not a crash
        return {"outcome": f"kvdoctor: {type(exc).__name__}: {exc}"[:160]}
    want = point["outcome"]
    if want["start"]:
        out["outcome"] = None if not got.refusals else f"kvdoctor refuses: {got.refusals[0].message[:120]}"
    elif not got.refusals:
        out["outcome"] = f"vLLM refuses ({want['class']}): {_inner(want)[:120]}"
    else:
        mine = got.refusals[0]
        same = mine.error_class == want["class"] and _norm(mine.message, str(model)) == _norm(_inner(want), str(model))
        out["outcome"] = None if same else f"{mine.error_class}: {mine.message[:80]} | vLLM {want['class']}: {_inner(want)[:80]}"
    if not_planned((point["config"].get("architectures") or [""])[0], release or VERSION):
        # VLM024 says kvdoctor leaves it to --dry-run: specs not compared, only the outcome (as test_vllm_profile.py)
        return {**out, "unmodelled": None}
    if point.get("layers"):
        by_index = {layer.index: layer for layer in got.layers if "engine_spec" in layer.extra}
        by_name = {layer.extra["name"]: layer for layer in got.layers if "name" in layer.extra}  # several per layer
        reason = None
        for row in point["layers"]:
            index = row["index"] if row["index"] is not None else _layer(row["name"])
            mine = by_name.get(row["name"]) or by_index.get(index)
            if mine is None:
                reason = f"layer {index}: no spec (vLLM {row['spec']})"
                break
            if mine.extra["engine_spec"] != row["spec"]:
                reason = f"layer {row['index']}: {mine.extra['engine_spec']} (vLLM {row['spec']})"
                break
            if row["spec"] == "MambaSpec":
                if mine.extra.get("state_shapes") != row["shapes"]:
                    reason = f"layer {row['index']}: state {mine.extra.get('state_shapes')} (vLLM {row['shapes']})"
                    break
                continue
            window = row["window"] if row["spec"] in SLIDING else row["attention_chunk_size"]
            have = (mine.engine_window, mine.extra["num_kv_heads"], mine.extra["head_size"], mine.extra["dtype"])
            if have != (window, row["num_kv_heads"], row["head_size"], row["dtype"]):
                reason = f"layer {row['index']}: {have} (vLLM {(window, row['num_kv_heads'], row['head_size'], row['dtype'])})"
                break
            if mine.extra["page_size_bytes"] // mine.extra["block_size"] != row["page_size_bytes"] // row["block_size"]:
                reason = f"layer {row['index']}: bytes per token differ"
                break
        count = len(by_name) or len(by_index)
        if reason is None and count != len(point["layers"]):
            reason = f"{count} specs (vLLM {len(point['layers'])})"
        out["layers"] = reason
    if point.get("groups"):
        want_groups = Counter((g["spec"], frozenset(map(_layer, g["layer_names"]))) for g in point["groups"])
        have_groups = Counter((g.spec, frozenset(g.layer_ids)) for g in got.facts.groups)
        out["groups"] = None if want_groups == have_groups and got.facts.hma == point["hma"]["on"] else (
            f"{len(have_groups)} groups {sorted({s for s, _ in have_groups})} "
            f"(vLLM {len(want_groups)} {sorted({s for s, _ in want_groups})})")
    return out


def main() -> None:
    path = Path(sys.argv[1])
    raw = path.read_bytes()  # a measured file may be stored gzipped (a config of megabytes per point)
    doc = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    release = doc["versions"]["vllm"]
    points = [p for p in doc["points"]  # as tests/test_vllm_profile.py compares them
              if p["outcome"]["start"] or not (p["outcome"].get("cpu_only") or p["outcome"].get("environment"))]
    rows = {"outcome": [0, 0], "layers": [0, 0], "groups": [0, 0], "unmodelled": [0, 0]}
    whole = 0
    misses = []
    with tempfile.TemporaryDirectory() as scratch:
        for point in points:
            result = compare(point, Path(scratch), release)
            for field, reason in result.items():
                rows[field][1] += 1
                rows[field][0] += reason is None
                if reason is not None:
                    misses.append(f"{point['model']} {point['mutation']} {point['setting']} [{field}] {reason}")
            whole += all(reason is None for reason in result.values())
    print(f"{path.name}: {whole} / {len(points)} points agree on every compared field")
    for field, (good, total) in rows.items():
        print(f"  {field}: {good} / {total}")
    if "--misses" in sys.argv:
        print("\n".join(misses))
    if "--merge" in sys.argv:  # the points that agree: a miss stays in the report, not in the goldens
        merge([p for p in doc["points"] if f"{p['model']} {p['mutation']} {p['setting']}"
               not in {" ".join(m.split()[:3]) for m in misses}], doc["versions"])


def merge(points: list[dict], versions: dict) -> None:
    goldens = Path(__file__).resolve().parent.parent / "goldens"
    golden = goldens / "vllm_check.json"
    if json.loads(golden.read_text())["versions"]["vllm"] != versions["vllm"]:
        golden = goldens / f"vllm_heldout-{versions['vllm']}.json"
    doc = json.loads(golden.read_text()) if golden.exists() else {
        "schema": "kvdoctor.goldens/1", "engine": "vllm", "versions": versions, "grid": "held-out", "points": []}

    def key(p: dict) -> tuple:
        return p["model"], p["mutation"], p["setting"], json.dumps(p["engine_args"], sort_keys=True), p["kv_budget_bytes"]

    held = {key(p) for p in doc["points"]}
    new = [p for p in points if key(p) not in held]
    doc["points"] += new
    golden.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"{golden}: {len(new)} points added ({len({p['model'] for p in new})} models), {len(doc['points'])} in all")


if __name__ == "__main__":
    main()
