"""The scatter kind: index_put / scatter / scatter_add."""
