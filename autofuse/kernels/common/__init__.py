"""What the kernel kinds share: the group and kernel records and the kind protocol (``base``),
the loop emitter and its parts, rendering of values, views and indexing, runtime sizes and
the kernel loader."""
