"""The partitions this group member owns right now.

One record shared by the parts that need it, so that none of them has to reach another
for it: ``Membership`` writes it in the rebalance callbacks (loop thread, inside
``consume``), and the exactly-once rewind and the consumer's statistics read it on that
same thread, so it needs no lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.core.types import PartitionKey

__all__ = ["Assignment"]


@dataclass(slots=True)
class Assignment:
    """Owned partitions, and when the last assignment came (monotonic seconds)."""

    partitions: set[PartitionKey] = field(default_factory=set)
    since: float = 0.0
