"""The one time budget every wait of the worker runs against."""

from __future__ import annotations

from tests.fakes.clock import FakeClock
from worker.core.deadline import Deadline


def test_remaining_and_passed_follow_the_clock() -> None:
    clock = FakeClock()
    deadline = Deadline.after(2.0, clock)
    assert deadline.at == 102.0
    assert deadline.remaining() == 2.0 and not deadline.passed()
    clock.now = 101.5
    assert deadline.remaining() == 0.5
    clock.now = 102.0
    assert deadline.passed() and deadline.remaining() == 0.0
    clock.now = 110.0
    assert deadline.remaining() == 0.0, "never below zero"


def test_wait_steps_until_done() -> None:
    clock, steps = FakeClock(), []
    deadline = Deadline.after(10.0, clock)

    def step() -> None:
        steps.append(clock.now)
        clock.now += 1.0

    assert deadline.wait(lambda: clock.now >= 103.0, step)
    assert steps == [100.0, 101.0, 102.0]


def test_wait_gives_up_at_the_deadline_without_another_step() -> None:
    clock, steps = FakeClock(), []
    deadline = Deadline.after(2.5, clock)

    def step() -> None:
        steps.append(clock.now)
        clock.now += 1.0

    assert not deadline.wait(lambda: False, step)
    assert steps == [100.0, 101.0, 102.0]
    assert clock.now == 103.0


def test_wait_done_at_once_takes_no_step() -> None:
    deadline = Deadline.after(0.0, FakeClock())
    assert deadline.wait(lambda: True, lambda: 1 / 0)
