"""The hostile-input corpus: tests/badinput_gen.py's cases and this package's, one list.

Modules by door: encodings (config.json, index and header bytes), files (links, special files, the
HF cache), checkpoints (header fields, the shard index), deploys (strict settings, YAML), bait (code
a model ships), cli (command-line misuse). Impossible-but-well-formed configs belong to the config
rules' own tests, not here.
"""
from badinput_gen import CASES as _GEN_CASES

from . import bait, checkpoints, cli, deploys, encodings, files  # noqa: F401  (each registers its cases)
from .base import CASES as _NEW_CASES

CASES = [*_GEN_CASES, *_NEW_CASES]
