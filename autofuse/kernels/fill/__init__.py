"""The fill kind: a pointwise group that reads no buffer (values from aranges and constants)."""
