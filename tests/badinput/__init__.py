"""The hostile-input corpus: tests/badinput_gen.py's cases and this package's, one list.

Modules by door: encodings (config.json, index and header bytes), files (links, special files, the
HF cache), checkpoints (header fields, the shard index), deploys (strict settings, YAML), bait (code
a model ships), cli (command-line misuse). Impossible-but-well-formed configs belong to the config
rules' own tests, not here. Every module registers into tests/badinput_base.py's one registry.
"""
import badinput_gen  # noqa: F401  (registers its cases first, as the list has always been ordered)
from badinput_base import CASES  # noqa: F401

from . import bait, checkpoints, cli, deploys, encodings, files  # noqa: F401  (each registers its cases)
