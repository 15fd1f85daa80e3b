"""Group coverage: when a gap in a settled group makes a member rejoin, and when not."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import cast

import pytest
from confluent_kafka import KafkaException

from worker.kafka.group_coverage import CoverageCheck, GroupCoverage, GroupView, unowned

ALL = frozenset(("t", p) for p in range(4))


def view(stable: bool = True, **members: list[int]) -> GroupView:
    return GroupView(
        stable=stable,
        members={m: frozenset(("t", p) for p in parts) for m, parts in members.items()},
        partitions=ALL,
    )


# The state the chaos runs ended in: the replacement of a member killed between its
# revoke and its rejoin holds [2, 3]; the other member nothing; 0 and 1 nobody.
ORPHANED = view(a=[], b=[2, 3])


def test_partitions_no_member_owns_in_a_stable_group() -> None:
    assert unowned(ORPHANED) == {("t", 0), ("t", 1)}
    assert unowned(view(a=[0, 1], b=[2, 3])) == frozenset()


def test_a_rebalancing_group_has_no_gap() -> None:
    assert unowned(view(stable=False, a=[], b=[2, 3])) == frozenset()
    assert unowned(view()) == frozenset()


def test_one_sighting_is_a_rebalance_in_flight_the_second_makes_the_emptiest_rejoin() -> None:
    check = CoverageCheck()
    assert check.observe(ORPHANED, "a") == frozenset()
    assert check.observe(ORPHANED, "a") == {("t", 0), ("t", 1)}
    assert check.observe(ORPHANED, "a") == frozenset()  # acted: counts from the start again


def test_a_member_owning_more_waits_a_third_sighting() -> None:
    check = CoverageCheck()
    assert check.observe(ORPHANED, "b") == frozenset()
    assert check.observe(ORPHANED, "b") == frozenset()
    assert check.observe(ORPHANED, "b") == {("t", 0), ("t", 1)}


def test_a_gap_that_closes_or_changes_between_reads_starts_over() -> None:
    check = CoverageCheck()
    check.observe(ORPHANED, "a")
    assert check.observe(view(a=[0, 1], b=[2, 3]), "a") == frozenset()
    assert check.observe(ORPHANED, "a") == frozenset()
    assert check.observe(view(a=[], b=[1, 2, 3]), "a") == frozenset()  # another gap: once
    assert check.observe(view(a=[], b=[1, 2, 3]), "a") == {("t", 0)}


def test_a_member_not_in_the_read_does_not_act() -> None:
    check = CoverageCheck()
    for _ in range(4):
        assert check.observe(ORPHANED, "c") == frozenset()


@dataclass
class Reads:
    views: list[GroupView | Exception]
    calls: int = 0
    asked: list[str] = field(default_factory=list)

    def read(self) -> GroupView:
        self.calls += 1
        got = self.views.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    def close(self) -> None:
        self.closed = True

    closed: bool = False


def coverage(reads: Reads, member: str = "a") -> tuple[GroupCoverage, list[int]]:
    counted: list[int] = []
    part = GroupCoverage(
        reads,
        member=member,
        rejoin=threading.Event(),
        interval_s=0.01,
        on_rejoin=lambda: counted.append(1),
    )
    return part, counted


def test_a_gap_seen_twice_asks_for_a_rejoin_names_it_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    part, counted = coverage(Reads([ORPHANED, ORPHANED]))
    part.check_once()
    assert not part.rejoin.is_set()
    with caplog.at_level(logging.WARNING, logger="worker.kafka.group_coverage"):
        part.check_once()
    assert part.rejoin.is_set()
    assert counted == [1]
    assert "t[0], t[1]" in caplog.text


def test_a_read_that_fails_is_skipped_and_breaks_no_streak() -> None:
    part, counted = coverage(Reads([ORPHANED, KafkaException("timed out"), ORPHANED]))
    for _ in range(3):
        part.check_once()
    assert part.rejoin.is_set() and counted == [1]


def test_a_member_not_in_the_group_yet_never_acts() -> None:
    part, counted = coverage(Reads([ORPHANED] * 4), member="c")
    for _ in range(4):
        part.check_once()
    assert not part.rejoin.is_set() and not counted


def test_the_thread_checks_until_stopped() -> None:
    part, counted = coverage(Reads([ORPHANED] * 1000))
    part.start()
    assert part.rejoin.wait(5.0)
    assert part.stop(5.0)
    assert counted
    assert cast(Reads, part._reader).closed  # the reader's child goes with the thread
