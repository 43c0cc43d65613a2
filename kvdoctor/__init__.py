"""kvdoctor: check a model's KV-cache layout against an engine before deploy."""

__version__ = "0.1.0"
