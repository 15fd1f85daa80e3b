"""How a batch's results become durable and its offsets committed: the delivery mode
Protocol, at-least-once, exactly-once and the committer."""

from __future__ import annotations

from worker.delivery.committer import CommitAnswers, Committer, OffsetConsumer
from worker.delivery.exactly_once import RewindGate, Transactional
from worker.delivery.mode import (
    AtLeastOnce,
    BatchGate,
    Delivery,
    ReportPolling,
    Stages,
    commit_before_leaving,
)

__all__ = [
    "AtLeastOnce",
    "BatchGate",
    "CommitAnswers",
    "Committer",
    "Delivery",
    "OffsetConsumer",
    "ReportPolling",
    "RewindGate",
    "Stages",
    "Transactional",
    "commit_before_leaving",
]
