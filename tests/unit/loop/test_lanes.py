"""LaneQueue: the highest ready lane first, first in first out within a lane, a lane
whose next stage is full skipped, and aging so that a lower lane is never starved."""

from __future__ import annotations

from worker.loop.lanes import LaneQueue

HIGH, LOW = 10, -10


def always(_lane: int, _item: object) -> bool:
    return True


def drain(queue: LaneQueue[str], now: float = 0.0) -> list[str]:
    out = []
    while (taken := queue.take(always, now)) is not None:
        out.append(taken.item)
    return out


def test_one_lane_is_first_in_first_out() -> None:
    queue: LaneQueue[str] = LaneQueue()
    for name in "abcd":
        queue.append(0, name, 0.0)
    assert len(queue) == 4 and list(queue) == ["a", "b", "c", "d"]
    assert drain(queue) == ["a", "b", "c", "d"]
    assert len(queue) == 0 and queue.take(always, 0.0) is None


def test_a_higher_lane_goes_first_and_each_lane_keeps_its_order() -> None:
    queue: LaneQueue[str] = LaneQueue()
    for i in range(3):
        queue.append(LOW, f"bulk{i}", 0.0)
    queue.append(HIGH, "live0", 1.0)
    queue.append(0, "normal0", 1.5)
    queue.append(HIGH, "live1", 2.0)
    assert queue.count(LOW) == 3 and queue.count(HIGH) == 2 and queue.count(5) == 0
    expected = ["live0", "live1", "normal0", "bulk0", "bulk1", "bulk2"]
    assert list(queue) == expected
    assert drain(queue, 2.1) == expected
    assert len(queue) == 0


def test_taken_says_how_long_the_item_waited() -> None:
    queue: LaneQueue[str] = LaneQueue()
    queue.append(LOW, "bulk", 1.0)
    queue.append(HIGH, "live", 3.0)
    first = queue.take(always, 3.5)
    second = queue.take(always, 4.0)
    assert first is not None and (first.item, first.lane, first.waited_s) == ("live", HIGH, 0.5)
    assert second is not None
    assert (second.item, second.waited_s, second.aged) == ("bulk", 3.0, False)


def test_a_lane_whose_next_stage_is_full_is_skipped() -> None:
    queue: LaneQueue[str] = LaneQueue()
    queue.append(HIGH, "live", 0.0)
    queue.append(LOW, "bulk", 0.0)
    taken = queue.take(lambda lane, _item: lane != HIGH, 0.0)
    assert taken is not None and taken.item == "bulk"
    assert queue.take(lambda lane, _item: lane != HIGH, 0.0) is None
    assert len(queue) == 1


def test_a_lower_lane_overtaken_too_long_goes_next_then_yields_again() -> None:
    """Sustained overload of the higher lane: the lower lane still gets one item through
    every ``max_overtaken_s``."""
    queue: LaneQueue[str] = LaneQueue(max_overtaken_s=1.0)
    queue.append(LOW, "bulk0", 0.0)
    queue.append(LOW, "bulk1", 0.0)
    taken = []
    now = 0.0
    for i in range(12):  # a higher-lane item arrives every 0.25 s, forever
        queue.append(HIGH, f"live{i}", now)
        got = queue.take(always, now)
        assert got is not None
        taken.append((got.item, got.aged))
        now += 0.25
    items = [item for item, _ in taken]
    assert items.index("bulk0") == 4, taken  # overtaken at 0.0, 0.25, 0.5, 0.75; aged at 1.0
    assert dict(taken)["bulk0"] is True
    assert items.index("bulk1") == 9, taken  # counting again from 1.25: aged at 2.25
    live = [item for item in items if item.startswith("live")]
    assert live == sorted(live, key=lambda name: int(name[4:])), "the higher lane keeps its order"


def test_a_lane_not_overtaken_while_blocked_does_not_age() -> None:
    """Aging counts only time passed over while ready: a lower lane held back by its own
    full next stage is not starved by this stage."""
    queue: LaneQueue[str] = LaneQueue(max_overtaken_s=1.0)
    queue.append(LOW, "bulk", 0.0)
    queue.append(HIGH, "live0", 0.0)
    queue.take(always, 0.0)  # live0 overtakes bulk
    queue.append(HIGH, "live1", 0.5)
    queue.take(lambda lane, _item: lane == HIGH, 0.5)  # bulk's next stage is full
    queue.append(HIGH, "live2", 2.0)
    got = queue.take(always, 2.0)
    assert got is not None and got.item == "live2" and not got.aged
    got = queue.take(always, 2.1)
    assert got is not None and got.item == "bulk" and not got.aged


def test_an_idle_higher_lane_never_holds_a_lower_one() -> None:
    queue: LaneQueue[str] = LaneQueue(max_overtaken_s=1000.0)
    for i in range(3):
        queue.append(LOW, f"bulk{i}", 0.0)
    assert drain(queue) == ["bulk0", "bulk1", "bulk2"]


def test_clear_forgets_items_and_aging() -> None:
    queue: LaneQueue[str] = LaneQueue(max_overtaken_s=1.0)
    queue.append(LOW, "bulk", 0.0)
    queue.append(HIGH, "live", 0.0)
    queue.take(always, 0.0)
    queue.clear()
    assert len(queue) == 0 and list(queue) == []
    queue.append(LOW, "bulk2", 5.0)
    queue.append(HIGH, "live2", 5.0)
    got = queue.take(always, 5.0)
    assert got is not None and got.item == "live2" and not got.aged
