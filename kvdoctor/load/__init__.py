"""Reading a model: bounded JSON and YAML, config.json with transformers' semantics, the safetensors
headers (never the weights), per-family layer meaning, and the strict value types of inputs."""
