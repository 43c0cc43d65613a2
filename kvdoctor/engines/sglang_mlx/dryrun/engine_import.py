"""Load sglang's MLX backend from the installed wheel without importing sglang as a whole.

`import sglang` runs `sglang/__init__.py`, which pulls in the language frontend, transformers patches
and, through the scheduler's memory pools, triton and the CUDA kernels. The MLX backend itself needs
none of that. This loader:

- registers `sglang` and the MLX `kv_cache` package as bare packages (their `__path__` points into the
  installed wheel, their `__init__` does not run), then imports the submodules the model runner uses,
  each from its own file in the wheel;
- re-exports the public names of those submodules on the bare `kv_cache` package, which is what the
  real `__init__` does, minus `auxiliary_state` (the scheduler's radix-cache adapter, which needs
  triton);
- puts one stand-in in place of `sglang.srt.mem_cache.memory_pool`: the runner imports only the name
  `ReqToTokenPool` from it and reads only its `req_to_token` table. The stand-in is kvdoctor's own
  class and is reported as modelled, never as engine code.

Written against the pinned sglang and mlx-lm (`PINNED`, from kvdoctor.engines.pins); another version is tried all the same
and reported with its version, so a failure to load says which release broke the assumption.
Everything here mutates `sys.modules`, so it runs only in the dry run's child process.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

import msgspec

from kvdoctor.engines.pins import PINS

PINNED = {"sglang": PINS["sglang"], "mlx-lm": PINS["mlx-lm"]}

MLX = "sglang.srt.hardware_backend.mlx"
KV_CACHE = f"{MLX}.kv_cache"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"

# The kv_cache submodules the runner needs, in dependency order (auxiliary_state left out, see above).
KV_CACHE_MODULES = ("attention_contract", "attention_kv_cache", "attention_kv_pool", "attention_wrapper",
                    "layout", "model_patching")
# Modules a dry run imports -> what to pip install. msgspec and psutil are the light packages the MLX
# modules import beyond mlx, mlx-lm, numpy and torch (sglang itself is installed with --no-deps).
REQUIRED_MODULES = {"sglang": f"sglang=={PINS['sglang']}", "mlx": "mlx[cpu]", "mlx_lm": "mlx-lm", "torch": "torch",
                    "msgspec": "msgspec", "psutil": "psutil"}


class EngineUnavailable(Exception):
    """The engine's packages are missing or could not be loaded; the message says which and why."""


class MlxBackend(msgspec.Struct):
    """Handles on the loaded engine modules, plus what kvdoctor put in place of engine code."""

    model_runner: types.ModuleType
    kv_cache: types.ModuleType
    contract: types.ModuleType
    remote_code_gate: types.ModuleType
    root: Path  # the installed sglang package directory
    versions: dict[str, str]
    stand_ins: list[str] = msgspec.field(default_factory=list)


def installed_versions() -> dict[str, str]:
    """Versions of the packages a dry run exercises; a missing one is left out."""
    versions = {}
    for name in ("sglang", "mlx-lm", "mlx"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def missing_packages() -> list[str]:
    """Packages the MLX backend needs that are not importable here (checked without importing them)."""
    return [pip for module, pip in REQUIRED_MODULES.items() if importlib.util.find_spec(module) is None]


def _bare_package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__file__ = None
    sys.modules[name] = module
    return module


class _ReqToTokenTable:
    """kvdoctor's stand-in for sglang's ReqToTokenPool: only the `req_to_token` table the MLX runner
    reads ([rows, max_context_len] int32, a token slot per request row and position)."""

    def __init__(self, size: int, max_context_len: int):
        import torch

        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32)


def _install_memory_pool_stand_in() -> None:
    module = types.ModuleType(MEMORY_POOL)
    module.__doc__ = "kvdoctor stand-in: the real module needs triton; the MLX runner uses one name from it."
    module.ReqToTokenPool = _ReqToTokenTable
    module.KVDOCTOR_STAND_IN = True
    sys.modules[MEMORY_POOL] = module


_LOADED: MlxBackend | None = None  # the backend this process loaded (a warm child's forks inherit it)


def load_mlx_backend() -> MlxBackend:
    """Import the sglang MLX model runner and its cache modules; raise EngineUnavailable if impossible.
    Once loaded, later calls in the same process return the same handles (nothing is imported twice)."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    missing = missing_packages()
    if missing:
        raise EngineUnavailable(f"not installed: {', '.join(missing)}")
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    if not (root / "srt" / "hardware_backend" / "mlx" / "model_runner.py").is_file():
        raise EngineUnavailable(f"{root} has no MLX backend (srt/hardware_backend/mlx/model_runner.py)")
    existing = sys.modules.get("sglang")
    if existing is not None and getattr(existing, "__file__", None):
        raise EngineUnavailable("sglang was already imported whole in this process; load it in a fresh one")
    try:
        _bare_package("sglang", root)
        kv_cache = _bare_package(KV_CACHE, root / "srt" / "hardware_backend" / "mlx" / "kv_cache")
        for name in KV_CACHE_MODULES:
            sub = importlib.import_module(f"{KV_CACHE}.{name}")
            for attr in dir(sub):
                if not attr.startswith("_"):
                    setattr(kv_cache, attr, getattr(sub, attr))
        _install_memory_pool_stand_in()
        model_runner = importlib.import_module(f"{MLX}.model_runner")
        gate = importlib.import_module(f"{MLX}.remote_code_gate")
    except Exception as exc:  # any import-time failure means this engine release can't be driven
        raise EngineUnavailable(f"loading the sglang MLX backend failed: {type(exc).__name__}: {exc}") from exc
    _LOADED = MlxBackend(model_runner=model_runner, kv_cache=kv_cache,
                         contract=sys.modules[f"{KV_CACHE}.attention_contract"], remote_code_gate=gate,
                         root=root, versions=installed_versions(),
                         stand_ins=[f"{MEMORY_POOL}.ReqToTokenPool (the request-to-slot table; the real "
                                    "module imports triton)"])
    return _LOADED
