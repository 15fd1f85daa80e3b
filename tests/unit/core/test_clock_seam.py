"""The one clock seam: waits give up by a ``Deadline`` on the clock they are handed, and
ages read from Kafka timestamps come from the injected wall clock, so a test drives both
by hand."""

from __future__ import annotations

import threading

import pytest

from tests.fakes.clock import FakeClock
from worker.compose import Metrics
from worker.core import DeliveryTracker
from worker.errors import FeatureStoreError
from worker.features import StoreWait
from worker.loop import RetiredBatches
from worker.ops import HealthState


def store_wait(clock: FakeClock, retry_s: float | None) -> StoreWait:
    return StoreWait(
        "p",
        retry_s=retry_s,
        abort=threading.Event(),
        errors=None,
        on_feature_store=lambda ok, why: None,
        clock=clock,
    )


def test_an_outage_is_given_up_once_the_next_try_would_pass_the_deadline_on_its_clock() -> None:
    clock = FakeClock()
    tries: list[float] = []

    def down() -> None:
        tries.append(clock.now)
        clock.now += 0.6  # each try takes 0.6 s on the injected clock
        raise FeatureStoreError("redis down")

    with pytest.raises(FeatureStoreError, match="redis down"):
        store_wait(clock, retry_s=1.0).call(down)
    # t=100.6: 0.4 s left, the next try in 0.1 s fits; t=101.2: the deadline has passed
    assert tries == [100.0, 100.6]


def test_a_store_that_answers_within_the_deadline_on_its_clock_is_waited_for() -> None:
    clock = FakeClock()
    failures = [FeatureStoreError("redis down")] * 2

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "rows"

    assert store_wait(clock, retry_s=0.25).call(flaky) == "rows"


def test_the_end_to_end_age_is_read_from_the_wall_clock_handed_in() -> None:
    metrics = Metrics()
    retired = RetiredBatches({"p": metrics.for_pipeline("p")}, wall=lambda: 1_000.0)
    retired(DeliveryTracker("p", oldest_ts_ms=998_500))
    registry = metrics.registry
    labels = {"pipeline": "p"}
    assert registry.get_sample_value("streamfer_end_to_end_seconds_sum", labels) == 1.5


def test_liveness_is_judged_on_the_clock_handed_in() -> None:
    clock = FakeClock()
    health = HealthState(liveness_timeout_s=60.0, clock=clock)
    clock.now += 59.0
    assert health.live()
    clock.now += 1.0
    assert not health.live(), "the loop has not turned for the whole timeout"
    health.turned()
    assert health.live()
