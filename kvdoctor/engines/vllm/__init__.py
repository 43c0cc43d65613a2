"""`vllm`: vLLM 0.33.0 (v1 engine, CUDA). The profile is `profile.VllmProfile` (check and budget); its
deploy section `settings.VllmSettings`. The package itself imports nothing heavy."""
