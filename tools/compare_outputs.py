"""Run `check` (every engine, every format, `--dry-run` where the engine runs here) and `budget` over
the real configs of `fixtures/configs/real` with two trees of kvdoctor, and compare the outputs byte
for byte.

    .venv/bin/python tools/compare_outputs.py --before REV [--after REV|.] [--out DIR]

Each tree runs from a git worktree (the working tree itself for `.`) with this venv's Python and
the tree first on PYTHONPATH, in one scratch folder holding the model folders, so the outputs name
the same relative paths. Before comparing, timings of the dry run are masked and the module names
a budget's provenance gives are read under their new names (RENAMED). One output is checked instead
of compared: the HTML report of a run with a deploy file must show, per model, the tokens
`kvdoctor budget` gives for that file (before the renovation it re-ran the budget without it).
Exit 0 when everything else is identical and every such HTML report agrees with `budget`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("hf", "vllm", "sglang", "sglang-mlx")
EXTRA_FORMATS = ("concise", "json-lines", "github")  # the ones --*-output cannot write beside the main one
DRY_RUN_MODELS = ("openai__gpt-oss-20b", "google__gemma-3-1b-it", "Qwen__Qwen2.5-7B-Instruct")
# Modules the renovation moved: as a budget's `provenance.formula` names one, and the rule modules of
# the codes whose rule moved, as `rules` names them in its `check` field.
RENAMED = {"kvdoctor.engines.sglang_cuda.budget": "kvdoctor.engines.sglang.budget"}
MOVED_RULES = {"LIM001": "kvdoctor.checks.lim", "VLM030": "kvdoctor.checks.dryrun_vllm",
               "SGL050": "kvdoctor.checks.dryrun_sglang", "SGL051": "kvdoctor.checks.dryrun_sglang"}
# The catalog's own commands, and triage of the project's own logs.
CATALOG_COMMANDS = {"rules.json": ["rules", "--format", "json"], "rules.txt": ["rules", "--verbose"],
                    **{f"explain-{code}.txt": ["explain", code] for code in ("SWA001", "ENG050", "VLM002", "MEM004")}}
TIMING = re.compile(r'("(?:seconds|estimated_seconds|rss_bytes|rss)": )[0-9.]+|( in )[0-9.]+( s\b)')
DEPLOY = "budget:\n  kv_budget: 40GiB\nvllm:\n  kv_cache_dtype: fp8\n  tp: 4\nsglang:\n  tp_size: 4\n"


def tree_for(rev: str, scratch: Path) -> Path:
    if rev == ".":
        return ROOT
    path = scratch / f"tree-{rev}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                       check=True, capture_output=True)
    return path


def run(tree: Path, cwd: Path, args: list[str], stdout: Path) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree), COLUMNS="160")
    env.pop("FORCE_COLOR", None)
    with stdout.open("wb") as out:
        done = subprocess.run([sys.executable, "-m", "kvdoctor", *args], cwd=cwd, env=env, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    (stdout.parent / (stdout.name + ".rc")).write_text(f"{done.returncode}\n")
    return done.returncode


def outputs(tree: Path, work: Path, out: Path) -> None:
    """Every output of one tree, under `out` (paths inside name `work`'s relative folders)."""
    out.mkdir(parents=True, exist_ok=True)
    models = sorted(p.name for p in (work / "models").iterdir())
    for engine in ENGINES:
        base = ["check", "models", "--engine", engine, "-q", "--isolated"]
        run(tree, work, [*base, "-o", "rel/rich.txt", "--json-output", "rel/json", "--sarif-output", "rel/sarif",
                         "--junit-output", "rel/junit", "--gitlab-output", "rel/gitlab", "--html-output",
                         "rel/html", "--kv-budget", "40GiB"], out / f"{engine}.stdout")
        for name in ("rich.txt", "json", "sarif", "junit", "gitlab", "html"):
            shutil.move(str(work / "rel" / name), out / f"{engine}.{name}")
        for fmt in EXTRA_FORMATS:
            run(tree, work, [*base, "--format", fmt], out / f"{engine}.{fmt}")
        # With the deploy file: everything but the HTML must match; the HTML is checked against `budget`.
        run(tree, work, [*base, "--deploy", "deploy.yaml", "--format", "json", "--html-output",
                         f"rel/deploy-{engine}.html"], out / f"{engine}.deploy.json")
        shutil.move(str(work / "rel" / f"deploy-{engine}.html"), out / f"deploy-{engine}.html")
    for name, args in CATALOG_COMMANDS.items():
        run(tree, work, args, out / name)
    for log in sorted((ROOT / "tests" / "data" / "logs").glob("*.log")):
        run(tree, work, ["triage", str(log), "--format", "json"], out / f"triage.{log.stem}.json")
    dry = [f"models/{m}" for m in DRY_RUN_MODELS if m in models]
    run(tree, work, ["check", *dry, "--engine", "sglang-mlx", "--dry-run", "-q", "--isolated", "--format", "json"],
        out / "sglang-mlx.dry-run.json")
    for model in models:
        run(tree, work, ["budget", f"models/{model}", "--kv-budget", "40GiB", "--format", "json", "--mode", "all"],
            out / f"budget.{model}.json")
        run(tree, work, ["budget", f"models/{model}", "--kv-budget", "40GiB"], out / f"budget.{model}.txt")
        run(tree, work, ["budget", f"models/{model}", "--deploy", "deploy.yaml", "--format", "json"],
            out / f"budget-deploy.{model}.json")


def normalized(path: Path) -> bytes:
    text = path.read_text(errors="replace")
    for old, new in RENAMED.items():
        text = text.replace(old, new)
    if "dry-run" in path.name:
        text = TIMING.sub(lambda m: (m.group(1) or m.group(2)) + "<t>" + (m.group(3) or ""), text)
    if path.name == "rules.json":
        entries = json.loads(text)
        for entry in entries:
            entry["check"] = MOVED_RULES.get(entry["code"], entry["check"])
        text = json.dumps(entries)
    if path.name == "rules.txt":
        lines, code = [], None
        for line in text.splitlines():
            code = line.split()[0] if re.match(r"^[A-Z]+[0-9]{3} ", line) else code
            if code in MOVED_RULES and "; check: " in line:
                line = re.sub(r"; check: \S+", f"; check: {MOVED_RULES[code]}", line)
            lines.append(line)
        text = "\n".join(lines)
    return text.encode()


def html_agrees_with_budget(tree: Path, out: Path, engine: str) -> list[str]:
    """Models whose section of deploy-ENGINE.html shows other tokens than `budget --deploy` gives."""
    sys.path.insert(0, str(tree))
    from kvdoctor.report.budget import tokens_fit

    page = (out / f"deploy-{engine}.html").read_text()
    wrong = []
    for section in re.split(r'<section class="model"(?: id="[^"]*")? data-target="models/', page)[1:]:  # ids: the index
        model = section.partition('"')[0]
        text = (out / f"budget-deploy.{model}.json").read_text()
        if "{" not in text:  # `budget` refused the model (one line); the page says why instead
            continue
        shown = {int(n.replace(",", "")) for n in re.findall(r"([\d,]+) tokens", section)}
        expected = {tokens_fit(row) for row in json.loads(text[text.index("{"):])["engines"]} - {None}
        if not expected <= shown:
            wrong.append(f"{engine} {model}: html {sorted(shown)} budget {sorted(expected)}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=".")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    scratch = Path(args.out or tempfile.mkdtemp(prefix="kvdoctor-compare-"))
    work = scratch / "work"
    (work / "rel").mkdir(parents=True, exist_ok=True)
    for config in sorted((ROOT / "fixtures/configs/real").glob("*.json")):
        folder = work / "models" / config.stem
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config, folder / "config.json")
    (work / "deploy.yaml").write_text(DEPLOY)
    sides = {}
    for side, rev in (("before", args.before), ("after", args.after)):
        sides[side] = scratch / side
        done = sides[side] / ".complete"
        if done.exists() and done.read_text() == rev and rev != ".":
            continue  # a fixed revision's outputs, kept from an earlier run in the same folder
        shutil.rmtree(sides[side], ignore_errors=True)
        outputs(tree_for(rev, scratch), work, sides[side])
        done.write_text(rev)
    names = sorted(p.name for p in sides["before"].iterdir() if p.name != ".complete")
    differ = [n for n in names if not n.startswith("deploy-")
              and normalized(sides["before"] / n) != normalized(sides["after"] / n)]
    missing = sorted(set(names) ^ {p.name for p in sides["after"].iterdir() if p.name != ".complete"})
    print(f"{len(names)} outputs compared under {scratch}: {len(differ)} differ, {len(missing)} on one side only")
    for name in differ + missing:
        print(f"  differs: {name}")
    wrong = [line for engine in ENGINES
             for line in html_agrees_with_budget(tree_for(args.after, scratch), sides["after"], engine)]
    print(f"HTML reports with a deploy file: {len(wrong)} model sections disagree with `kvdoctor budget`")
    for line in wrong:
        print(f"  {line}")
    return 1 if differ or missing or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
