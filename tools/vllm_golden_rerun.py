"""Does a stored vLLM goldens file still reproduce? Compare a rerun of its oracle, point by point.

    python3 goldens/releases.py --check-only --configs SAMPLE_DIR --out /tmp/rerun.json vllm==0.31.0
    python3 tools/vllm_golden_rerun.py goldens/vllm_check-0.31.0.json /tmp/rerun.json

    KVDOCTOR_GOLDEN_MODELS=a,b KVDOCTOR_GOLDEN_NAME=../../../tmp/budget VLLM_TARGET_DEVICE=cpu \
        goldens/.venv/vllm-0.31.0/bin/python goldens/vllm_oracle.py     # from goldens/
    python3 tools/vllm_golden_rerun.py goldens/vllm-0.31.0.json /tmp/budget.json

Each rerun point is matched to the stored point of the same model, mutation, setting and config (start-up goldens) or
the same model and settings (budget goldens) and compared whole, except what differs between two runs of the
same code on one machine: the order of the logged warnings (compared as a set) and the temporary model folders in
messages. `--ignore FIELD` leaves a field out wherever it occurs, to tell a difference in what the engine decided
from one in what an older oracle or harness recorded. Prints the points that agree out of those compared, each
difference, and any rerun point the stored file lacks. Exit 1 on any difference. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

TEMP = re.compile(r"/tmp/[^\s'\"]+")  # the oracle's temporary model folders, named differently on each run


def key(point: dict) -> str:
    if "settings" in point:
        return json.dumps([point["model"], point["settings"]], sort_keys=True)
    # the config too: vllm_check.json holds a model of fixtures/models and its namesake of fixtures/configs/real
    return json.dumps([point["model"], point["mutation"], point["setting"], point["config"]], sort_keys=True)


def clean(value: object, ignored: set[str]) -> object:
    """The value with its temporary folders masked and, at any depth, the ignored fields left out; the log is
    compared apart (`warnings`: as a set, since their order follows the import order)."""
    if isinstance(value, dict):
        return {k: clean(v, ignored) for k, v in value.items() if k not in ignored and k != "log"}
    if isinstance(value, list):
        return [clean(v, ignored) for v in value]
    return TEMP.sub("<tmp>", value) if isinstance(value, str) else value


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stored", type=Path)
    parser.add_argument("rerun", type=Path)
    parser.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                        help="leave this field out wherever it occurs (`log`: the warnings); repeatable")
    args = parser.parse_args()
    ignored = set(args.ignore)
    stored_doc, rerun_doc = (json.loads(p.read_text()) for p in (args.stored, args.rerun))
    print(f"stored: vLLM {stored_doc['versions'].get('vllm')}, transformers {stored_doc['versions'].get('transformers')}; "
          f"rerun: vLLM {rerun_doc['versions'].get('vllm')}, transformers {rerun_doc['versions'].get('transformers')}")
    stored = {key(p): p for p in stored_doc["points"]}
    agree, compared, bad = 0, 0, False
    for point in rerun_doc["points"]:
        k = key(point)
        if k not in stored:
            print(f"not in the stored file: {k[:200]}")
            bad = True
            continue
        compared += 1
        diffs = differences(clean(stored[k], ignored), clean(point, ignored))
        if "log" not in ignored and warnings(stored[k]) != warnings(point):
            diffs.append("log: the warnings differ")
        agree += not diffs
        for d in diffs:
            print(f"{k[:120]}: {d}")
        bad |= bool(diffs)
    skipped = rerun_doc.get("skipped") or {}  # models the release could not plan on the CPU, with why
    if any((stored_doc.get("skipped") or {}).get(model) != why for model, why in skipped.items()):
        print(f"skipped differ: rerun {skipped}, stored {stored_doc.get('skipped')}")
        bad = True
    print(f"{agree}/{compared} points agree" + (f" (leaving out {', '.join(sorted(ignored))})" if ignored else "")
          + (f"; skipped in the rerun: {', '.join(skipped)}" if skipped else ""))
    return int(bad)


if __name__ == "__main__":
    raise SystemExit(main())
