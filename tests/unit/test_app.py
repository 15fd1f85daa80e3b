"""The worker's start-up choices that need no broker."""

from __future__ import annotations

from worker.app import warm_up_sizes


def test_warm_up_covers_every_power_of_two_and_the_maximum() -> None:
    assert warm_up_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert warm_up_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert warm_up_sizes(1) == [1]
