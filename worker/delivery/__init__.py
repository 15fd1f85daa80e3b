"""How a batch's results become durable and its offsets committed: the delivery mode
Protocol, at-least-once, exactly-once, the committer, and the dead letters of records
the broker refuses for themselves (``RefusedRecords``, which a share group's loop
delivers through as well)."""

from __future__ import annotations

from worker.delivery.committer import CommitAnswers, Committer, OffsetConsumer
from worker.delivery.exactly_once import RewindGate, Transactional
from worker.delivery.metrics import DeliveryFamilies
from worker.delivery.mode import (
    AtLeastOnce,
    BatchGate,
    Delivery,
    ReportPolling,
    Stages,
    commit_before_leaving,
)
from worker.delivery.refused import RefusedRecords

__all__ = [
    "AtLeastOnce",
    "BatchGate",
    "CommitAnswers",
    "Committer",
    "Delivery",
    "DeliveryFamilies",
    "OffsetConsumer",
    "RefusedRecords",
    "ReportPolling",
    "RewindGate",
    "Stages",
    "Transactional",
    "commit_before_leaving",
]
