#!/usr/bin/env bash
# Regenerates goldens/{vllm,sglang,mlx}.json with the engines' own sizing code (a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")"
bash setup_venvs.sh
VLLM_TARGET_DEVICE=cpu .venv/vllm/bin/python vllm_oracle.py
PYTHONPATH=stubs .venv/sglang/bin/python sglang_oracle.py
.venv/mlx/bin/python mlx_oracle.py
