"""Hunt for crashes and error findings on mutated real configs: apply issue 43's mutations to every
config of fixtures/configs/real and run `check --static` in this process for every engine `check`
takes, then count what came back.

    .venv/bin/python tools/mutate_configs.py [--engine vllm] [--mutation null-window] [--kv-budget 40GiB]
        [--tp 8] [--set radix_cache=false ...] [--json out.json] [--configs 'fixtures/configs/fresh/v9_*.json']

`--kv-budget`, `--tp` and each `--set KEY=VALUE` (a YAML value) go into each engine's deploy section where
its settings take that key, so that the sizing (and the rules that read it) runs too.

A crash is an exception out of the check, or a result whose error says "internal error" (what the
command line turns into exit 3 or an internal-error line); those are listed in full. Error findings
are counted per code, since most mutations make a config that an engine does refuse. Exit 1 when
anything crashed.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvdoctor.catalog import builtin_catalog  # noqa: E402
from kvdoctor.checks.selection import Selection  # noqa: E402
from kvdoctor.engines import check_engines, profile_class, section_name  # noqa: E402
from kvdoctor.engines.deploy import deploy_from  # noqa: E402
from kvdoctor.engines.nodeploy import NoDeployFile  # noqa: E402
from kvdoctor.pipeline.check import Options, check_target  # noqa: E402

REAL = ROOT / "fixtures" / "configs" / "real"
SLIDING, FULL = "sliding_attention", "full_attention"
TP_KEYS = ("tensor_parallel_size", "tp_size", "tp")  # what each engine's section calls it


def _text(cfg: dict) -> dict:
    """The mapping that holds the layers (a multimodal config's text_config)."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else cfg


def _types(text: dict) -> list | None:
    types = text.get("layer_types")
    return types if isinstance(types, list) and types else None


def shifted(text: dict) -> bool:
    types = _types(text)
    if types is None or len(set(map(str, types))) < 2:
        return False
    text["layer_types"] = types[1:] + types[:1]
    return True


def truncated(text: dict) -> bool:
    types = _types(text)
    if types is None:
        return False
    text["layer_types"] = types[:-1]
    return True


def dropped(text: dict) -> bool:
    return text.pop("layer_types", None) is not None


def all_sliding(text: dict) -> bool:
    n = text.get("num_hidden_layers")
    if not isinstance(n, int) or n <= 0 or text.get("sliding_window") is None:
        return False
    text["layer_types"] = [SLIDING] * n
    return True


def extra_mtp(text: dict) -> bool:
    types = _types(text)
    if types is None:
        return False
    text["layer_types"] = types + [FULL]
    return True


def null_window(text: dict) -> bool:
    if text.get("sliding_window") is None:
        return False
    text["sliding_window"] = None
    return True


def window_without_types(text: dict) -> bool:
    changed = text.pop("layer_types", None) is not None
    if text.get("sliding_window") is None:
        text["sliding_window"] = 4096
        changed = True
    return changed


MUTATIONS: dict[str, Callable[[dict], bool]] = {
    "shifted": shifted, "truncated": truncated, "dropped": dropped, "all-sliding": all_sliding,
    "extra-mtp": extra_mtp, "null-window": null_window, "window-without-types": window_without_types}


def mutated(configs: list[Path], names: list[str], root: Path) -> list[tuple[str, str, Path]]:
    """(config stem, mutation, model folder) for every mutation that changes a config."""
    out = []
    for path in configs:
        base = json.loads(path.read_text(encoding="utf-8"))
        for name in names:
            cfg = copy.deepcopy(base)
            if not MUTATIONS[name](_text(cfg)):
                continue
            folder = root / f"{path.stem}--{name}"
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
            out.append((path.stem, name, folder))
    return out


def deploy(engine: str, kv_budget: str | None, tp: int | None, extra: dict[str, Any]) -> Any:
    """The deploy settings for one engine: its section with the keys its settings take."""
    fields = profile_class(engine).Settings.model_fields
    tp_key = next((key for key in TP_KEYS if key in fields), None)
    pairs = [("kv_budget", kv_budget), (tp_key, tp), *extra.items()]
    section = {key: value for key, value in pairs if value is not None and key in fields}
    return deploy_from({"engine": engine, section_name(engine): section}) if section else NoDeployFile()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", help="engines to run (default: every engine check takes)")
    parser.add_argument("--mutation", action="append", choices=sorted(MUTATIONS))
    parser.add_argument("--kv-budget", help="KV memory per GPU for the engines that size, e.g. 40GiB")
    parser.add_argument("--tp", type=int, help="tensor parallel size for the engines that take one")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a deploy setting for the engines whose section takes KEY (repeatable)")
    parser.add_argument("--json", help="write every (config, mutation, engine) outcome here")
    parser.add_argument("--configs", help="a glob of config.json files instead of fixtures/configs/real/*.json")
    args = parser.parse_args()
    engines = args.engine or check_engines()
    extra = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.set)}
    names = args.mutation or list(MUTATIONS)
    catalog = builtin_catalog()
    crashes: list[dict[str, Any]] = []
    errors: collections.Counter[str] = collections.Counter()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kvdoctor-mutate-") as tmp:
        configs = sorted(ROOT.glob(args.configs)) if args.configs else sorted(REAL.glob("*.json"))
        models = mutated(configs, names, Path(tmp))
        for engine in engines:
            opts = Options(catalog=catalog, engine=engine, deploy=deploy(engine, args.kv_budget, args.tp, extra),
                           static=True,
                           selection=Selection(select=("ALL",)))
            for stem, name, folder in models:
                row: dict[str, Any] = {"config": stem, "mutation": name, "engine": engine}
                try:
                    result = check_target(str(folder), opts)
                except Exception as exc:  # noqa: BLE001 - what this tool looks for
                    row["crash"] = f"{type(exc).__name__}: {exc}"
                    row["traceback"] = traceback.format_exc()
                else:
                    if result.error and "internal error" in result.error:
                        row["crash"] = result.error
                    row["error"] = result.error
                    row["errors"] = sorted({f.code for f in result.findings if f.severity == "error"})
                    errors.update(row["errors"])
                if "crash" in row:
                    crashes.append(row)
                outcomes.append(row)
    with_errors = sum(1 for row in outcomes if row.get("errors"))
    print(f"{len(models)} mutated configs x {len(engines)} engines = {len(outcomes)} checks: "
          f"{len(crashes)} crashes, {with_errors} with error findings")
    print("error findings per code: " + ", ".join(f"{code} {n}" for code, n in sorted(errors.items())))
    for row in crashes:
        print(f"CRASH {row['engine']} {row['config']} [{row['mutation']}]: {row['crash']}")
        if "traceback" in row:
            print("    " + row["traceback"].strip().splitlines()[-3].strip())
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes, indent=1), encoding="utf-8")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
