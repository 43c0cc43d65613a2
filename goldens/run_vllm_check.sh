#!/usr/bin/env bash
# Regenerates goldens/vllm_check.json: vLLM 0.33.0's own start-up, per-layer KV specs and KV planning on CPU
# over fixtures/models and fixtures/configs/real, with the mutations and settings of
# issue 14. KVDOCTOR_GOLDEN_MODELS=a,b limits the models; ORACLE_PYTHON picks another oracle venv's python.
set -euo pipefail
cd "$(dirname "$0")"
PY=${ORACLE_PYTHON:-.venv/vllm/bin/python}
if [ ! -x "$PY" ]; then bash setup_venvs.sh; fi
VLLM_TARGET_DEVICE=cpu "$PY" vllm_check_oracle.py
