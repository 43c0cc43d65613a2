"""KV budget per engine and mode, the part every engine shares: the `budget` command, the result types,
the model facts, the `budget:` settings, the memory each engine gets and the report. Each engine's
sizing model is the budget half of its profile (`kvdoctor/engines/vllm/budget.py`,
`engines/sglang_cuda/budget.py`, `engines/mlx_lm/budget.py`): how vLLM, SGLang and mlx-lm (versions
in kvdoctor.engines.pins) size the KV caches and state of a model, computed with kvdoctor's own code
(no engine is imported) and checked against golden numbers from the engines' own sizing functions
(goldens/)."""
