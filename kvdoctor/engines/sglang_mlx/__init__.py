"""`sglang-mlx`: sglang's MLX backend serving models through mlx-lm. `profile.SglangMlxProfile` is
the profile; the MLX-side machinery beside it:

- `mlxlm`: ask mlx-lm itself: cheap import, a weightless skeleton of the model class, and what the
  sglang MLX backend reads off it (layer list, attention children, per-layer window map).
- `caches`: kvdoctor's own windowed / contiguous per-request KV caches with the backend's contract.
- `probes`: drive those caches through the model's own mask routing with canary keys.
- `pool`: the shared full-attention pool and an emulated fused RoPE + pool-scatter.
- `dryrun/`: the backend's own code on a weightless, shrunk copy of the model, in a child process.

Every module here imports mlx lazily (inside functions) or is only imported by checks that build
caches, so static checks never pay for it.
"""
