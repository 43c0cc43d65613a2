"""What the oracle scripts share: the model list, the setting grids, the JSON writer and a run in a fork.

Each oracle runs in its own venv (see README.md) and imports only its engine; this module imports
nothing but the standard library so all three can use it.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "fixtures" / "models"  # the ten fixture models' config.json files
GiB = 1 << 30


def model_dirs(drop_keys: tuple[str, ...] = ()) -> dict[str, Path]:
    """Model name -> a temporary directory holding only its config.json (engines want a dir).

    `drop_keys` removes top-level keys an oracle cannot load on a CPU box and that do not touch
    KV sizing (SGLang rejects gpt-oss's mxfp4 `quantization_config` when the device is CPU)."""
    root = Path(tempfile.mkdtemp(prefix="kvdoctor-goldens-"))
    out: dict[str, Path] = {}
    for path in sorted(CONFIGS.iterdir()):
        src = path / "config.json" if path.is_dir() else path
        if src.suffix != ".json" or not src.exists():
            continue
        name = path.stem if path.is_file() else path.name
        (root / name).mkdir()
        if drop_keys:
            cfg = json.loads(src.read_text())
            for key in drop_keys:
                cfg.pop(key, None)
            (root / name / "config.json").write_text(json.dumps(cfg, indent=2))
        else:
            shutil.copy(src, root / name / "config.json")
        out[name] = root / name
    return out


def max_position(config_dir: Path) -> int:
    cfg = json.loads((config_dir / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    return int(text.get("max_position_embeddings") or 131072)


def contexts(limit: int) -> list[int]:
    """The context lengths of the grid that the model accepts, plus its own maximum."""
    return sorted({c for c in (4096, 32768, 131072) if c <= limit} | {limit})


def write(name: str, engine: str, versions: dict[str, str], points: list[dict],
          skipped: dict[str, str] | None = None) -> Path:
    """`skipped`: models the release's code could not plan on the CPU, with why (only where there are any)."""
    doc = {
        "schema": "kvdoctor.goldens/1",
        "engine": engine,
        "versions": versions,
        "generated": datetime.date.today().isoformat(),
        "configs": "fixtures/models",
        "points": points,
        **({"skipped": skipped} if skipped else {}),
    }
    name = os.environ.get("KVDOCTOR_GOLDEN_NAME", name)  # goldens/releases.py: vllm-0.34.0 and so on
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"wrote {path} ({len(points)} points)")
    return path


def load_startup():
    """kvdoctor/engines/vllm/startup.py by path (the vLLM oracles' point runner and stand-ins): its folder must
    not go on sys.path (its profile.py would shadow the stdlib's)."""
    import importlib.util

    path = HERE.parent / "kvdoctor" / "engines" / "vllm" / "startup.py"
    spec = importlib.util.spec_from_file_location("kvdoctor_vllm_startup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def only_models() -> set[str] | None:
    """KVDOCTOR_GOLDEN_MODELS=a,b limits a run to some models (for debugging an oracle)."""
    value = os.environ.get("KVDOCTOR_GOLDEN_MODELS")
    return set(value.split(",")) if value else None


def forked(work: Callable[[], Any], crashed: Callable[[str], Any]) -> Any:
    """`work()` in a fork of this process, its imports and process-wide state left there; its JSON-able result, or
    `crashed(why)` when it raised or the fork died."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - the parent records it
            result = crashed(f"{type(exc).__name__}: {exc}"[:300])
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else crashed("the fork died")
