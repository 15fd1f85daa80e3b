"""The delivery modes' metrics: batches in flight and the offset commits they send."""

from __future__ import annotations

from worker.ops import Families, counter, gauge

__all__ = ["DeliveryFamilies"]


class DeliveryFamilies(Families):
    """The families a delivery mode updates."""

    in_flight_batches = gauge(
        "streamfer_in_flight_batches", "Batches submitted but not yet committed"
    )
    commits = counter("streamfer_commits", "Offset commits issued")
    commit_failures = counter("streamfer_commit_failures", "Offset commits rejected or failed")
