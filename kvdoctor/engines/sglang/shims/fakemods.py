"""Import-only stand-ins for CUDA extension packages that a CUDA install of SGLang has.

Not SGLang code. Each name becomes an importable package whose every attribute (and sub-module) is
a do-nothing placeholder; calling a kernel through one would be a bug in the oracle, so placeholders
raise when called, except as a decorator (one callable argument), which hands the function back unchanged so that
a module defining kernels still imports. Versions read as 0.0.0+fake.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# `cuda`: cuda-python (`Requires-Dist: cuda-python>=13.0`, sglang-0.5.15's METADATA), which 0.5.15's DeepSeek
# model module reaches at import time through sglang/jit_kernel/cutedsl_fp8_paged_mqa_logits.py:59.
FAKED = ("sgl_kernel", "flashinfer", "deep_gemm", "cutlass", "quack", "torchaudio", "flash_attn",
         "flash_mla", "sgl_kernel_npu", "cuda")


class _Placeholder(type):
    """A class object that stands for any attribute; subclassing and isinstance keep working."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):  # a decorator at import time: the function as is
            return args[0]  # (0.5.15's cutedsl kernels, imported eagerly by jit_kernel/dsa/__init__.py:12)
        raise RuntimeError(f"oracle called a faked CUDA symbol: {cls.__qualname__}")


def _placeholder(name: str):
    return _Placeholder(name.rsplit(".", 1)[-1], (), {"__qualname__": name, "__module__": "fakemods"})


class _FakeModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name not in ("__version__",):
            raise AttributeError(name)
        if name == "__version__":
            return "0.0.0+fake"
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _FakeModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+fake"
        return module

    def exec_module(self, module):
        pass


def install(extra: tuple[str, ...] = ()) -> None:
    """`extra`: more top-level names to fake (the probe fakes torchvision, whose wheel needs a CUDA torch)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(FAKED + extra))
