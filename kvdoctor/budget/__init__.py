"""KV budget per engine and mode: how vLLM 0.33.0, SGLang 0.5.23 and mlx-lm 0.32.2 size the KV caches
and state of a model, computed with kvdoctor's own code (no engine is imported) and checked against
golden numbers produced by the engines' own sizing functions (goldens/)."""
