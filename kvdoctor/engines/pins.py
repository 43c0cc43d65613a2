"""The engine versions kvdoctor describes, by distribution name: the only place each is written.

Profiles take their `pins` from here, and so do the budget models, the dry run and the reports. A
separate module rather than a constant in one profile because two profiles describe the same sglang
release (its CUDA side and its MLX backend) and the budget modules import the pins without importing
a profile.
"""
from __future__ import annotations

PINS: dict[str, str] = {
    "sglang": "0.5.23",
    "vllm": "0.33.0",
    "mlx-lm": "0.32.2",
}
