"""Records near a share group's delivery limit are served alone only as far as the lock
budget allows: the rest go in as few groups as fit, never released, so a healthy record
is never driven to its last delivery (a dead letter, unprocessed) by the worker's own
releases."""

from __future__ import annotations

from typing import Any

from streamfer_dev.modelgen import DemoModel
from tests.fakes.clock import FakeClock
from tests.fakes.share import request, share_worker
from worker.loop.share_poll import LockBudget, group_size


def slow_passes(rig: Any, clock: FakeClock, *seconds: float) -> list[list[str]]:
    """Each pipeline pass (one Redis fetch) takes the next of ``seconds`` of ``clock``,
    the last one for every pass after."""
    fetched: list[list[str]] = []
    inner = rig.store.get_many

    def get_many(entities: Any) -> Any:
        clock.now += seconds[min(len(fetched), len(seconds) - 1)]
        fetched.append(list(entities))
        return inner(entities)

    rig.store.get_many = get_many
    return fetched


def test_healthy_records_near_the_limit_all_reach_the_model_when_they_do_not_fit_alone(
    classifier: DemoModel,
) -> None:
    """Ten healthy records delivered 3 times of 5; the lock budget (8 s of a 10 s lock)
    holds two passes of 3 s: the first is served alone, the rest of the poll together,
    and nothing is released."""
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, limit=5, batch=8, lock_s=10.0, clock=clock)
    fetched = slow_passes(rig, clock, 3.0)
    rig.consumer.waiting += [request(i, count=3) for i in range(10)]
    for _ in range(3):
        rig.worker.run_once()
    assert sorted(r["id"] for r in rig.sink.delivered_to("res")) == sorted(
        f"r{i}" for i in range(10)
    )
    assert rig.sink.delivered_to("dlq") == []
    assert rig.consumer.released() == []
    assert rig.consumer.accepted() == list(range(10))
    # poll of 10 (the in-flight bound 16): one alone (3 s), then 9 in one pass (at most
    # the batch size 8, so 8 and 1): no turn past the 8 s budget is started
    assert [len(f) for f in fetched] == [1, 8, 1]


def test_a_group_never_exceeds_the_batch_size(classifier: DemoModel) -> None:
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, limit=5, batch=2, in_flight=4, lock_s=10.0, clock=clock)
    fetched = slow_passes(rig, clock, 3.0, 0.1)  # one slow turn: the rest must go in one
    rig.consumer.waiting += [request(i, count=4) for i in range(6)]
    rig.worker.run_once()
    assert [len(f) for f in fetched] == [1, 2, 2, 1]
    assert rig.consumer.released() == []
    assert len(rig.sink.delivered_to("res")) == 6


def test_records_that_fit_alone_are_still_served_one_by_one(classifier: DemoModel) -> None:
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, limit=5, batch=4, lock_s=30.0, clock=clock)
    fetched = slow_passes(rig, clock, 1.0)
    rig.consumer.waiting += [request(i, count=3) for i in range(6)]
    rig.worker.run_once()
    assert [len(f) for f in fetched] == [1] * 6
    sent = [[at[2] for at, _ in batch] for batch in rig.consumer.sent]
    assert sent == [[5], [4], [3], [2], [1], [0]]


def test_a_stop_releases_the_records_not_served_yet(classifier: DemoModel) -> None:
    """A stop lets the turns go on for the shutdown timeout (30 s), then releases what
    is left and leaves the group."""
    clock = FakeClock(1000.0)
    rig = share_worker(classifier, limit=5, batch=4, lock_s=1000.0, clock=clock)
    inner = rig.store.get_many

    def get_many(entities: Any) -> Any:
        clock.now += 40.0
        rig.worker.stop()
        return inner(entities)

    rig.store.get_many = get_many  # type: ignore[method-assign]
    rig.consumer.waiting += [request(i, count=3) for i in range(4)]
    rig.worker.run(burst_idle_s=1.0)
    # the stop is seen by 80 s at the latest: the fourth pass ends at 160 s, past 30 s more
    accepted, released = rig.consumer.accepted(), rig.consumer.released()
    assert accepted and released and sorted(accepted + released) == [0, 1, 2, 3]
    assert sorted(r["id"] for r in rig.sink.delivered_to("res")) == [f"r{i}" for i in accepted]
    assert rig.consumer.closed


def test_group_size_fills_the_time_left_with_turns() -> None:
    assert group_size(10, 8.0, None) == 1  # unknown: alone
    assert group_size(4, 8.0, 2.0) == 1  # fits: alone
    assert group_size(9, 5.0, 3.0) == 9  # one turn left: all of them
    assert group_size(10, 7.0, 3.0) == 5  # two turns left
    assert group_size(10, -1.0, 3.0) == 10  # past the budget: all at once
    assert group_size(1, 0.0, 3.0) == 1


def test_the_time_of_a_turn_follows_the_slowest_recent_one() -> None:
    clock = FakeClock(1000.0)
    budget = LockBudget(10.0, clock)
    assert budget.turn_s is None
    clock.now += 3.0
    budget.observe_turn(clock.now - 3.0)
    budget.observe_turn(clock.now - 1.0)
    assert budget.turn_s == 3.0 * 0.8
    budget.observe_turn(clock.now - 5.0)
    assert budget.turn_s == 5.0
