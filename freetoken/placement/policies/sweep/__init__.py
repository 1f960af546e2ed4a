"""The layer-sweep family: layer_sweep (evict the key expected back last, knowing every token visits the MoE layers
in order), lookahead (+ the early router's picks prefetched and kept) and hinted_sweep (+ the picks as evidence in
the waits, a prefetch only when it beats its victim). walk.py is their shared victim walk, family.py their one
compiled State."""

from freetoken.placement.policies.sweep import family  # noqa: E402,F401  (gives the three their compiled half)
