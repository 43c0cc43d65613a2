"""How an engine's message in the goldens is compared with kvdoctor's: the one reading the held-out tools
(vllm_heldout.py, sglang_agreement.py) and the golden tests share."""
from __future__ import annotations

import re


def sets_sorted(text: str) -> str:
    """A Python set in a message ("Must be one of: {'moe', 'mlp'}") prints in the process's string-hash order, which
    changes from one process to the next: its members sorted."""
    return re.sub(r"\{('[^{}]*')\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", text)
