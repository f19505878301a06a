"""Partition: the legal fusion decisions of a graph (vertical and horizontal edges), each
refusal with its reason."""

from autofuse.partition.partitioner import (
    Edge,
    Partition,
    Partitioner,
    Refusal,
    TooManyPartitions,
)

__all__ = ["Edge", "Partition", "Partitioner", "Refusal", "TooManyPartitions"]
