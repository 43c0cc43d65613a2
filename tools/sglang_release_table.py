"""Per SGLang release, how many golden points its profile agrees on, row by row (issue 42's table).

    PYTHONPATH=. .venv/bin/python tools/sglang_release_table.py [RELEASE ...] [--misses]

For each profiled release with goldens: the sizing file (goldens/sglang-<release>.json; sglang.json for the pinned
release), judged as tests/test_budget_goldens.py judges it, and the start-up check file
(goldens/sglang_check-<release>.json; sglang_check.json for the pinned release, over the same grid as the others:
the real configs, unmutated, default / tp8 / fp8_kv), judged row by row by tools/sglang_agreement.py. A point the
tests mark xfail is a miss here like any other.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "tests")]

from sglang_agreement import ROWS, judge  # noqa: E402
from test_budget_goldens import assert_sglang_point  # noqa: E402 - the sizing tests' own reading of a point

GOLDENS = ROOT / "goldens"
RELEASE_GRID = {"default", "tp8", "fp8_kv"}
REAL = {p.stem for p in (ROOT / "fixtures" / "configs" / "real").glob("*.json")}


def release_files() -> dict[str, tuple[Path, Path]]:
    """release -> (sizing file, check file)."""
    out = {}
    for sizing in [*sorted(GOLDENS.glob("sglang-*.json")), GOLDENS / "sglang.json"]:
        release = json.loads(sizing.read_text())["versions"]["sglang"]
        check = GOLDENS / sizing.name.replace("sglang", "sglang_check", 1)
        out[release] = (sizing, check)
    return out


def score(release: str, sizing: Path, check: Path, work: Path) -> tuple[dict[str, collections.Counter], list[str]]:
    totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    misses = []
    for point in json.loads(sizing.read_text())["points"]:
        try:
            assert_sglang_point(point, release)
            totals["budget sizing"]["agree"] += 1
        except AssertionError as exc:
            totals["budget sizing"]["miss"] += 1
            misses.append(f"[budget sizing] {point['model']}: {str(exc).splitlines()[0][:140]}")
    for point in json.loads(check.read_text())["points"]:
        if (point["result"]["outcome"] in ("not_applicable", "crash") or point["mutation"] != "none"
                or point["model"] not in REAL or point["setting"] not in RELEASE_GRID):
            continue
        for row, why in judge(point, work, release).items():
            totals[row]["agree" if why is None else "miss"] += 1
            if why is not None:
                misses.append(f"[{row}] {point['model']} {point['setting']}: {why}")
    return totals, misses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="*", help="only these releases (default: every one with goldens)")
    parser.add_argument("--misses", action="store_true", help="list every miss with its reason")
    args = parser.parse_args()
    files = release_files()
    rows = ("budget sizing", *ROWS)
    print(f"{'release':13s} " + " ".join(f"{row:>16s}" for row in rows) + f" {'all':>16s}")
    with tempfile.TemporaryDirectory() as tmp:
        for release in args.releases or files:
            totals, misses = score(release, *files[release], Path(tmp))
            cells = []
            for row in (*rows, None):
                agree = sum(totals[r]["agree"] for r in rows) if row is None else totals[row]["agree"]
                total = agree + (sum(totals[r]["miss"] for r in rows) if row is None else totals[row]["miss"])
                cells.append(f"{agree}/{total} {100 * agree / total:5.1f}%" if total else "-")
            print(f"{release:13s} " + " ".join(f"{c:>16s}" for c in cells), flush=True)
            for miss in misses if args.misses else ():
                print(f"  MISS {miss}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
