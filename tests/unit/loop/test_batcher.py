"""The micro-batcher: size and time windows, driven by a fake clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.fakes.clock import FakeClock
from worker.config import BatchPolicy
from worker.loop.batcher import Batcher


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


BatcherFactory = Callable[..., Batcher[Any]]


@pytest.fixture
def make_batcher(clock: FakeClock) -> BatcherFactory:
    def make(max_batch_size: int = 4, max_wait_ms: float = 50.0) -> Batcher[Any]:
        policy = BatchPolicy(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        return Batcher(policy, clock)

    return make


def test_closes_at_max_batch_size(make_batcher: BatcherFactory) -> None:
    b = make_batcher(max_batch_size=3)
    assert b.add([1, 2]) == []
    assert len(b) == 2
    assert b.add([3]) == [[1, 2, 3]]
    assert len(b) == 0
    assert b.deadline() is None


def test_empty_add_is_a_no_op(make_batcher: BatcherFactory, clock: FakeClock) -> None:
    b = make_batcher()
    assert b.add([]) == []
    assert len(b) == 0
    assert b.deadline() is None
    clock.advance(1000)
    assert b.expired() is None


def test_closes_max_wait_after_first_item(make_batcher: BatcherFactory, clock: FakeClock) -> None:
    b = make_batcher(max_batch_size=100, max_wait_ms=50)
    b.add([1])
    clock.advance(30)
    b.add([2])  # a later item does not extend the window
    clock.advance(19.9)
    assert b.expired() is None
    clock.advance(0.1)
    assert b.expired() == [1, 2]
    assert len(b) == 0
    assert b.expired() is None


def test_deadline_is_first_arrival_plus_max_wait(
    make_batcher: BatcherFactory, clock: FakeClock
) -> None:
    b = make_batcher(max_batch_size=100, max_wait_ms=250)
    assert b.deadline() is None
    start = clock.now
    b.add([1])
    assert b.deadline() == pytest.approx(start + 0.25)
    clock.advance(100)
    b.add([2, 3])
    assert b.deadline() == pytest.approx(start + 0.25)
    b.flush()
    assert b.deadline() is None


def test_zero_wait_expires_immediately(make_batcher: BatcherFactory) -> None:
    b = make_batcher(max_batch_size=10, max_wait_ms=0)
    b.add([7])
    assert b.expired() == [7]


def test_flush_returns_open_batch_then_none(make_batcher: BatcherFactory) -> None:
    b = make_batcher(max_batch_size=10)
    assert b.flush() is None
    b.add([1, 2, 3])
    assert b.flush() == [1, 2, 3]
    assert len(b) == 0
    assert b.flush() is None


def test_one_add_yields_several_full_batches(make_batcher: BatcherFactory) -> None:
    b = make_batcher(max_batch_size=3)
    b.add([0])
    batches = b.add(list(range(1, 9)))
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(b) == 0
    assert b.deadline() is None


def test_items_keep_arrival_order_across_batches(make_batcher: BatcherFactory) -> None:
    b = make_batcher(max_batch_size=4)
    out: list[list[int]] = []
    for chunk in ([0, 1, 2], [3, 4], [5, 6, 7, 8, 9, 10]):
        out.extend(b.add(chunk))
    rest = b.flush()
    assert rest is not None
    out.append(rest)
    assert out == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]


def test_window_restarts_for_the_remainder(make_batcher: BatcherFactory, clock: FakeClock) -> None:
    b = make_batcher(max_batch_size=2, max_wait_ms=50)
    b.add([1])
    clock.advance(40)
    assert b.add([2, 3]) == [[1, 2]]
    # 3 arrived at t=40ms: its window runs to t=90ms, not to the first batch's t=50ms.
    assert b.deadline() == pytest.approx(clock.now + 0.05)
    clock.advance(20)
    assert b.expired() is None
    clock.advance(30)
    assert b.expired() == [3]


def test_new_window_after_flush(make_batcher: BatcherFactory, clock: FakeClock) -> None:
    b = make_batcher(max_batch_size=10, max_wait_ms=50)
    b.add([1])
    clock.advance(45)
    assert b.flush() == [1]
    b.add([2])
    assert b.deadline() == pytest.approx(clock.now + 0.05)
    clock.advance(10)  # 55 ms after the old first item, 10 ms after the new one
    assert b.expired() is None


def test_drop_forgets_items_of_revoked_keys(make_batcher: BatcherFactory) -> None:
    b: Batcher[tuple[str, int]] = make_batcher(max_batch_size=10)
    b.add([("a", 1), ("b", 2), ("a", 3), ("c", 4)])
    assert b.drop({"a", "c"}, key_of=lambda item: item[0]) == 3
    assert len(b) == 1
    assert b.flush() == [("b", 2)]


def test_drop_with_nothing_to_drop(make_batcher: BatcherFactory) -> None:
    b = make_batcher(max_batch_size=10)
    assert b.drop({"x"}, key_of=str) == 0
    b.add([1, 2])
    assert b.drop(set(), key_of=str) == 0
    assert b.drop({"9"}, key_of=str) == 0
    assert len(b) == 2


def test_drop_everything_then_new_window(make_batcher: BatcherFactory, clock: FakeClock) -> None:
    b = make_batcher(max_batch_size=10, max_wait_ms=50)
    b.add([1, 2])
    assert b.drop({1, 2}, key_of=lambda item: item) == 2
    assert b.deadline() is None
    clock.advance(100)
    b.add([3])
    assert b.deadline() == pytest.approx(clock.now + 0.05)
    assert b.expired() is None


def _adaptive(clock: FakeClock, budget_ms: float | None) -> Batcher[Any]:
    policy = BatchPolicy(
        max_batch_size=100, max_wait_ms=50.0, mode="adaptive", latency_budget_ms=budget_ms
    )
    return Batcher(policy, clock)


def test_adaptive_window_shrinks_by_the_age_of_the_first_record(clock: FakeClock) -> None:
    b = _adaptive(clock, budget_ms=40.0)
    assert b.adaptive
    b.add(["old"], age_s=0.030)  # 30 ms old on arrival: 10 ms of budget left
    assert b.deadline() == pytest.approx(clock.now + 0.010)
    clock.advance(9)
    assert b.expired() is None
    clock.advance(1)
    assert b.expired() == ["old"]


def test_adaptive_window_never_exceeds_max_wait_nor_goes_negative(clock: FakeClock) -> None:
    b = _adaptive(clock, budget_ms=1000.0)
    b.add(["fresh"], age_s=0.0)
    assert b.deadline() == pytest.approx(clock.now + 0.050)
    b.flush()
    b.add(["stale"], age_s=5.0)
    assert b.deadline() == pytest.approx(clock.now)
    assert b.expired() == ["stale"]


def test_window_resets_to_max_wait_for_the_next_batch(clock: FakeClock) -> None:
    b = _adaptive(clock, budget_ms=40.0)
    b.add(["a"], age_s=0.035)
    assert b.expired() is None
    clock.advance(5)
    assert b.expired() == ["a"]
    b.add(["b"], age_s=0.0)
    assert b.deadline() == pytest.approx(clock.now + 0.040)


def test_fixed_policy_ignores_age(make_batcher: BatcherFactory, clock: FakeClock) -> None:
    b = make_batcher(max_wait_ms=50.0)
    assert not b.adaptive
    b.add(["x"], age_s=10.0)
    assert b.deadline() == pytest.approx(clock.now + 0.050)
