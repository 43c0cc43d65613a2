"""vLLM 0.33.0 profile: per-layer KV cache specs, KV cache groups and start-up refusals (see profile.py)."""
