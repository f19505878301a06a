"""The attention backward kind: dQ, dK, dV from recomputed tiles."""
