"""ENG065 for the vLLM and SGLang dry runs (read by dryrun_vllm.py and dryrun_sglang.py): the child
stopped because of the engine Python it ran in, not because of the engine or the model. A module the
child imports is missing there (the engine itself, or one of its requirements), or the Python cannot run
the child at all. Either way the fix is the environment's, so it is never ENG051's "report upstream"."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvdoctor.model import Finding, ModelSpec

if TYPE_CHECKING:
    from kvdoctor.engines.base import DryRun

MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
CANNOT_IMPORT = re.compile(r"ImportError: (cannot import name .+|.+ requires .+)")
NOT_RUNNABLE = re.compile(r"SyntaxError: .+|exec format error|cannot execute binary file")


def environment_finding(record: DryRun, spec: ModelSpec) -> Finding | None:
    """ENG065 when the dry run shows an environment problem: in the exception the child reported, or in
    what it printed before it died."""
    engine = record.engine
    if record.error is not None:  # the child reported the exception itself
        text = f"{record.error.cls}: {record.error.message}"
    elif record.outcome in ("timeout", "crashed"):  # it died first: the exception its traceback ended with
        lines = [line for line in record.stderr_tail.splitlines() if line.strip()]  # (earlier lines: optional imports)
        text = lines[-1] if lines else ""
    else:
        return None
    python = record.python or "the engine's Python"
    fix = f"`kvdoctor engines install {engine}` builds the engine's CPU venv where kvdoctor finds it"
    missing = MISSING.findall(text)
    if missing:
        module = missing[-1]
        top = module.partition(".")[0]
        if top == engine:  # a plain `pip install ENGINE` would pull its CUDA server: only the recipe
            what = f"{python} has no {top}; {fix}, or give --engine-python a Python with {engine}"
        else:
            what = (f"{python} lacks the module {module!r} that {engine} imports; {fix}, or run "
                    f"`{python} -m pip install {top.replace('_', '-')}`")
        return Finding.at("ENG065", f"dry run skipped: {what}; the static {engine} checks still ran",
                          spec.key_source("model_type"), evidence={"python": python, "missing_module": module})
    broken = CANNOT_IMPORT.search(text) or (NOT_RUNNABLE.search(text) if not record.versions else None)
    if broken:
        return Finding.at("ENG065", f"dry run skipped: {python} cannot run {engine}'s dry run ({broken.group(0)}); "
                          f"{fix}, or give --engine-python a Python with {engine} and its requirements; the "
                          f"static {engine} checks still ran", spec.key_source("model_type"),
                          evidence={"python": python, "error": broken.group(0)})
    if record.outcome == "crashed" and not record.versions:
        return Finding.at("ENG065", f"dry run skipped: {python} {record.reason} without "
                          f"importing {engine} (is it a Python 3.10+ with {engine}?); {fix}; the static {engine} "
                          "checks still ran", spec.key_source("model_type"), evidence={"python": python})
    return None
