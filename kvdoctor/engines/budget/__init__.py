"""What every engine's KV budget shares: the result types (`common`), the model facts (`facts`), the
`budget:` settings (`settings`) and the memory each engine gets (`run`). Each engine's sizing model is
the budget half of its profile (`engines/vllm/budget.py`, `engines/sglang/budget.py`,
`engines/mlx_lm/budget.py`): how vLLM, SGLang and mlx-lm (versions in kvdoctor.engines.pins) size
the KV caches and state of a model, computed with kvdoctor's own code (no engine is imported) and
checked against golden numbers from the engines' own sizing functions (goldens/)."""
