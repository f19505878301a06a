"""The reduction kinds: row reductions (``kind``), their row ops (softmax-like whole-row
values) and the scan kind (cumsum / cumprod)."""
