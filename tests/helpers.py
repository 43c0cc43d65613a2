"""Shared test helpers: model dirs built from the real configs, with sparse real-shape checkpoints."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from kvdoctor.load.synth import layout_for, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "fixtures" / "models"
REAL_NAMES = sorted(p.name for p in REAL.iterdir() if (p / "config.json").exists())
SHORT = {
    "gpt-oss-20b": "openai__gpt-oss-20b",
    "gemma-3-1b-it": "google__gemma-3-1b-it",
    "gemma-2-2b": "google__gemma-2-2b",
    "kimi-linear": "moonshotai__Kimi-Linear-48B-A3B-Instruct",
    "llama-3.1-8b": "meta-llama__Llama-3.1-8B",
    "mistral-7b": "mistralai__Mistral-7B-v0.1",
    "qwen2.5-7b": "Qwen__Qwen2.5-7B-Instruct",
    "qwen3-next": "Qwen__Qwen3-Next-80B-A3B-Instruct",
    "olmo3": "allenai__Olmo-3.1-32B-Instruct",
    "phi3-mini": "microsoft__Phi-3-mini-4k-instruct",
}


def real_config(name: str) -> dict[str, Any]:
    return json.loads((REAL / SHORT.get(name, name) / "config.json").read_text())


def make_model(tmp_path: Path, name: str | dict, edit: Callable[[dict], None] | None = None,
               checkpoint: bool = True, shards: int = 1,
               tensors: Callable[[dict], None] | None = None, dirname: str | None = None) -> Path:
    """A model dir from a real config (or a dict), optionally edited, with a sparse checkpoint whose
    tensors follow the *unedited* config unless `tensors` edits the layout."""
    cfg = dict(name) if isinstance(name, dict) else real_config(name)
    d = tmp_path / (dirname or (name if isinstance(name, str) else cfg.get("model_type", "model")))
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    if checkpoint:
        layout = layout_for(d)
        if tensors:
            tensors(layout)
        write_checkpoint(d, layout, shards=shards)
    if edit:
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d


def run(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process: exit codes and stderr exactly as a user sees them."""
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kvdoctor", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=600)


def check_json(*args: str, **kw) -> tuple[int, dict]:
    proc = run("check", "--format", "json", *args, **kw)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}


def codes(doc: dict, target: int = 0) -> list[str]:
    return [f["code"] for f in doc["results"][target]["findings"]]


def masked(value: Any, keys: set[str] | frozenset[str]) -> Any:
    """`value` with the entries under `keys` (timings) replaced at every depth, for comparing two runs."""
    if isinstance(value, dict):
        return {k: "<timing>" if k in keys else masked(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, keys) for v in value]
    return value
