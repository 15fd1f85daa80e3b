"""The plain records and types every layer uses: a batch in flight (``Job``), its delivery
tracker, partition keys, the one clock seam and the one deadline. Nothing here imports
another worker module.

Every unit imports this face, and the light paths (``streamfer --help``, ``import
worker``) need only ``__version__``; so every other name is read from its module on first
use (``worker.core.lazy``), and ``Job`` and the tracker's ``confluent_kafka`` load only
for the callers that ask for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core.lazy import lazy_names
from worker.core.version import __version__

if TYPE_CHECKING:
    from worker.core.assignment import Assignment
    from worker.core.clock import Clock, monotonic_clock, wall_clock
    from worker.core.deadline import Deadline
    from worker.core.extras import extra_requirements, install_command
    from worker.core.job import Job, next_offsets
    from worker.core.parked import Parked
    from worker.core.text import safe_text
    from worker.core.tracker import NO_REFUSALS, RESENDS_PER_RECORD, DeliveryTracker, Published
    from worker.core.types import (
        DecodedRequests,
        PartitionKey,
        Refusal,
        Rejection,
        Source,
        StageTimings,
    )

__all__ = [
    "NO_REFUSALS",
    "RESENDS_PER_RECORD",
    "Assignment",
    "Clock",
    "Deadline",
    "DecodedRequests",
    "DeliveryTracker",
    "Job",
    "Parked",
    "PartitionKey",
    "Published",
    "Refusal",
    "Rejection",
    "Source",
    "StageTimings",
    "__version__",
    "extra_requirements",
    "install_command",
    "lazy_names",
    "monotonic_clock",
    "next_offsets",
    "safe_text",
    "wall_clock",
]

__getattr__ = lazy_names(
    __name__,
    {
        "Assignment": "assignment",
        "Clock": "clock",
        "monotonic_clock": "clock",
        "wall_clock": "clock",
        "Deadline": "deadline",
        "extra_requirements": "extras",
        "install_command": "extras",
        "Job": "job",
        "next_offsets": "job",
        "Parked": "parked",
        "safe_text": "text",
        "DeliveryTracker": "tracker",
        "NO_REFUSALS": "tracker",
        "RESENDS_PER_RECORD": "tracker",
        "Published": "tracker",
        "DecodedRequests": "types",
        "PartitionKey": "types",
        "Refusal": "types",
        "Rejection": "types",
        "Source": "types",
        "StageTimings": "types",
    },
)
