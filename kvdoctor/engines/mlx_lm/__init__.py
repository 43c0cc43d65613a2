"""`mlx-lm`: mlx-lm's own generation loop. The profile is `profile.MlxLmProfile` (budget only); its sizing
model, also used for `sglang-mlx`'s mlx-lm models, is `budget`. The package itself imports nothing heavy."""
