"""Many targets in one run: expanding folders of models, checking them in parallel or on Ray, shards,
and merging the shards' reports."""
