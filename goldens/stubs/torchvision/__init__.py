"""A stand-in for torchvision in the SGLang oracle venv.

The PyPI torchvision wheel does not load against torch 2.13.0+cpu, and SGLang's (and transformers')
vision modules import it at module level; the KV sizing code never calls it. Every submodule and
attribute under `torchvision` resolves to a dummy, so those imports succeed.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class _Dummy:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return _Dummy()

    def __call__(self, *args, **kwargs):
        return _Dummy()

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Dummy()
