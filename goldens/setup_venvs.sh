#!/usr/bin/env bash
# Builds the three oracle venvs under goldens/.venv/ (git-ignored). Engines go in with --no-deps:
# a plain install would pull a CUDA torch. torch stays pinned at 2.13.0 (the CPU build).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
V=.venv

if [ ! -x $V/vllm/bin/python ]; then
  $PY -m venv $V/vllm
  $V/vllm/bin/pip install -q torch==2.13.0
  $V/vllm/bin/pip install -q --no-deps vllm==0.33.0
  $V/vllm/bin/pip install -q packaging numpy regex pydantic cbor2 psutil pyzmq urllib3 \
    "transformers>=5.16.1,<5.21" aiohttp requests openai-harmony openai pillow pybase64 cachetools msgspec \
    cloudpickle uvloop py-cpuinfo prometheus_client xgrammar==0.2.8 "fastapi>=0.133,<0.137" \
    partial-json-parser "llguidance>=1.7,<1.8" einops compressed-tensors==0.17.0 \
    jsonschema tiktoken "pydantic-extra-types[pycountry]"
  # mistral_common (Devstral's model module imports it) only on the oracle's path: imported in the venv, its
  # tokenizer starts a thread while vllm.engine.arg_utils loads, which keeps the dry run's warm child from forking
  $V/vllm/bin/pip install -q --no-deps --target .venv-extra/vllm mistral_common==1.13.1
fi

if [ ! -x $V/sglang/bin/python ]; then
  $PY -m venv $V/sglang
  $V/sglang/bin/pip install -q torch==2.13.0
  $V/sglang/bin/pip install -q --no-deps sglang==0.5.23 triton==3.7.1
  $V/sglang/bin/pip install -q packaging numpy regex pydantic psutil pyzmq requests msgspec pybase64 \
    "transformers>=5.16,<5.21" aiohttp orjson einops pillow python-dateutil ipython dill sentencepiece starlette \
    openai openai-harmony partial-json-parser
  $V/sglang/bin/pip install -q --no-deps apache-tvm-ffi==0.1.11 compressed-tensors loguru gguf
fi

if [ ! -x $V/mlx/bin/python ]; then
  $PY -m venv $V/mlx
  $V/mlx/bin/pip install -q "mlx[cpu]==0.32.4"
  $V/mlx/bin/pip install -q --no-deps mlx-lm==0.32.2
  $V/mlx/bin/pip install -q numpy "transformers<5.21" protobuf pyyaml jinja2 sentencepiece
fi
echo "oracle venvs ready under goldens/$V"
