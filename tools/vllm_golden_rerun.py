"""Does a stored vLLM goldens file still reproduce? Compare a rerun of its oracle, point by point.

    python3 goldens/releases.py --check-only --configs SAMPLE_DIR --out /tmp/rerun.json vllm==0.31.0
    python3 tools/vllm_golden_rerun.py goldens/vllm_check-0.31.0.json /tmp/rerun.json

    KVDOCTOR_GOLDEN_MODELS=a,b KVDOCTOR_GOLDEN_NAME=../../../tmp/budget VLLM_TARGET_DEVICE=cpu \
        goldens/.venv/vllm-0.31.0/bin/python goldens/vllm_oracle.py     # from goldens/
    python3 tools/vllm_golden_rerun.py goldens/vllm-0.31.0.json /tmp/budget.json

Each rerun point is matched to the stored point of the same model, mutation and setting (start-up goldens) or
the same model and settings (budget goldens) and compared whole, except what differs between two runs of the
same code on one machine (NOISE: the log's order and the temporary model folder in messages). Prints the points
that agree out of those compared, each difference, and any rerun point the stored file lacks. Exit 1 on any
difference. Standard library only: runs with any Python.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

NOISE = ("log",)  # warnings vLLM logged: their order follows the import order, compared as a set below
TEMP = re.compile(r"/tmp/[^\s'\"]+")  # the oracle's temporary model folders, named differently on each run


def key(point: dict) -> str:
    if "settings" in point:
        return json.dumps([point["model"], point["settings"]], sort_keys=True)
    return json.dumps([point["model"], point["mutation"], point["setting"]])


def clean(point: dict) -> object:
    kept = {k: v for k, v in point.items() if k not in NOISE}
    return json.loads(TEMP.sub("<tmp>", json.dumps(kept, sort_keys=True)))


def warnings(point: dict) -> list[str]:
    return sorted(TEMP.sub("<tmp>", json.dumps(row, sort_keys=True)) for row in point.get("log") or [])


def differences(stored: object, rerun: object, path: str = "") -> list[str]:
    if isinstance(stored, dict) and isinstance(rerun, dict):
        return [d for k in sorted(set(stored) | set(rerun))
                for d in (differences(stored.get(k), rerun.get(k), f"{path}.{k}") if k in stored and k in rerun
                          else [f"{path}.{k}: only in {'stored' if k in stored else 'rerun'}"])]
    if isinstance(stored, list) and isinstance(rerun, list) and len(stored) == len(rerun):
        return [d for i, (a, b) in enumerate(zip(stored, rerun)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if stored == rerun else [f"{path}: stored {json.dumps(stored)[:200]}, rerun {json.dumps(rerun)[:200]}"]


def main() -> int:
    stored_doc, rerun_doc = (json.loads(Path(p).read_text()) for p in sys.argv[1:3])
    print(f"stored: vLLM {stored_doc['versions'].get('vllm')}, transformers {stored_doc['versions'].get('transformers')}; "
          f"rerun: vLLM {rerun_doc['versions'].get('vllm')}, transformers {rerun_doc['versions'].get('transformers')}")
    stored = {key(p): p for p in stored_doc["points"]}
    agree, compared, bad = 0, 0, False
    for point in rerun_doc["points"]:
        k = key(point)
        if k not in stored:
            print(f"not in the stored file: {k}")
            bad = True
            continue
        compared += 1
        diffs = differences(clean(stored[k]), clean(point))
        if warnings(stored[k]) != warnings(point):
            diffs.append("log: the warnings differ")
        agree += not diffs
        for d in diffs:
            print(f"{k}: {d}")
        bad |= bool(diffs)
    skipped = sorted(set(rerun_doc.get("skipped") or {}))
    if skipped != sorted(set(stored_doc.get("skipped") or {}) & set(skipped)):
        print(f"skipped differ: rerun {skipped}, stored {sorted(stored_doc.get('skipped') or {})}")
        bad = True
    print(f"{agree}/{compared} points agree" + (f"; skipped in both: {', '.join(skipped)}" if skipped else ""))
    return int(bad)


if __name__ == "__main__":
    sys.exit(main())
