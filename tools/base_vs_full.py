"""Compare the base install's `check --static` with the full install's over the real configs of
`fixtures/configs/real`, for every engine `check` takes: the warnings and errors per target must be
the same (info-level notes may differ: they say what an extra would add), and no run may print a
traceback.

    .venv/bin/python tools/base_vs_full.py --base /tmp/bare/bin/python [--full .venv/bin/python]

The base Python is a venv holding only kvdoctor's base requirements (pyproject's `dependencies`); both
run this checkout (it goes first on PYTHONPATH). Exit 0 when every engine agrees.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvdoctor.engines import check_engines  # noqa: E402


def findings(python: str, engine: str, models: Path) -> tuple[dict[str, collections.Counter], str]:
    """Per target, the (code, severity, layer) of its warnings and errors; and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    proc = subprocess.run([python, "-m", "kvdoctor", "check", str(models), "--engine", engine, "--static",
                           "--format", "json", "-j", "1"], capture_output=True, text=True, env=env, cwd=models.parent)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{python} --engine {engine}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    out = {}
    for result in json.loads(proc.stdout)["results"]:
        out[Path(result["target"]).name] = collections.Counter(
            (f["code"], f["severity"], f.get("layer")) for f in result["findings"]
            if f["severity"] in ("error", "warning"))
    return out, proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="Python of a venv with only the base requirements")
    parser.add_argument("--full", default=sys.executable, help="Python of a venv with every extra")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kvdoctor-base-vs-full-"))
    models = scratch / "models"
    for config in sorted((ROOT / "fixtures/configs/real").glob("*.json")):
        (models / config.stem).mkdir(parents=True)
        shutil.copyfile(config, models / config.stem / "config.json")
    differ_total = 0
    for engine in check_engines():
        base, base_err = findings(args.base, engine, models)
        full, full_err = findings(args.full, engine, models)
        differ = sorted(t for t in full if base.get(t) != full[t])
        count = {side: (sum(1 for c in found.values() for k in c.elements() if k[1] == "error"),
                        sum(1 for c in found.values() for k in c.elements() if k[1] == "warning"),
                        sum(1 for c in found.values() if any(k[1] == "error" for k in c)))
                 for side, found in (("base", base), ("full", full))}
        tracebacks = sum(err.count("Traceback") for err in (base_err, full_err))
        print(f"{engine}: {len(full)} targets; errors/warnings/targets with errors: base {count['base']}, "
              f"full {count['full']}; {len(differ)} targets differ; {tracebacks} tracebacks")
        for target in differ:
            print(f"  {target}: only base {sorted((base.get(target, collections.Counter()) - full[target]).elements())}"
                  f", only full {sorted((full[target] - base.get(target, collections.Counter())).elements())}")
        differ_total += len(differ) + tracebacks
    shutil.rmtree(scratch)
    return 1 if differ_total else 0


if __name__ == "__main__":
    sys.exit(main())
