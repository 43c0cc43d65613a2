"""KDA ReplaySSM state caches (engine profile `sglang`): allocation recipes, real torch caches,
the decode wrapper's validations, a reference replay kernel and the optional GPU run.

Only `recipe` and `dims` are imported by the static plan; the other modules import torch.
"""
