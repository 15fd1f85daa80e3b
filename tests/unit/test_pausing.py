"""PausingManager: pause every owned partition at the bound, resume at half, and give every
newly assigned partition the worker's current state (librdkafka keeps a pause through a
revoke and a later re-assignment)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.commit import PartitionKey
from worker.pausing import PausingManager, describe_partitions

P0, P1, P2 = ("req", 0), ("req", 1), ("req", 2)


@dataclass
class FakeSwitch:
    """Keeps the pause state the way librdkafka does: per partition, whoever owns it."""

    paused: set[PartitionKey] = field(default_factory=set)
    calls: list[tuple[str, set[PartitionKey]]] = field(default_factory=list)

    def pause(self, partitions: set[PartitionKey]) -> None:
        self.calls.append(("pause", set(partitions)))
        self.paused |= partitions

    def resume(self, partitions: set[PartitionKey]) -> None:
        self.calls.append(("resume", set(partitions)))
        self.paused -= partitions


def make(bound: int = 100) -> tuple[PausingManager, FakeSwitch, list[int]]:
    switch, seen = FakeSwitch(), []
    return PausingManager(switch, bound, seen.append), switch, seen


def test_nothing_happens_under_the_bound() -> None:
    pausing, switch, seen = make()
    pausing.update(99, {P0, P1})
    assert switch.calls == [] and seen == [0]


def test_every_owned_partition_pauses_at_the_bound_and_resumes_at_half() -> None:
    pausing, switch, seen = make()
    pausing.update(100, {P0, P1})
    assert switch.paused == {P0, P1} and pausing.paused == {P0, P1}
    pausing.update(51, {P0, P1})
    assert switch.paused == {P0, P1}, "still over half the bound"
    pausing.update(50, {P0, P1})
    assert switch.paused == set() and not pausing.paused
    assert seen == [2, 2, 0]


def test_a_partition_assigned_while_paused_is_paused_too() -> None:
    pausing, switch, _ = make()
    pausing.update(100, {P0})
    pausing.assigned({P1})
    pausing.update(80, {P0, P1})  # between half and the bound: stays paused
    assert switch.paused == {P0, P1}
    pausing.update(10, {P0, P1})
    assert switch.paused == set()


def test_a_partition_paused_then_revoked_then_assigned_again_is_resumed() -> None:
    pausing, switch, _ = make()
    pausing.update(100, {P0, P1})
    pausing.forget({P0})  # revoked: librdkafka keeps its pause
    pausing.update(10, {P1})
    assert switch.paused == {P0}
    pausing.assigned({P0})
    pausing.update(10, {P0, P1})
    assert switch.paused == set(), "the partition must be fetched again"


def test_a_revoked_partition_is_never_resumed_by_this_worker() -> None:
    pausing, switch, _ = make()
    pausing.update(100, {P0, P1})
    pausing.forget({P1})
    pausing.update(0, {P0})
    assert ("resume", {P0}) in switch.calls
    assert all(P1 not in parts for verb, parts in switch.calls if verb == "resume")


def test_an_assignment_revoked_before_the_next_turn_is_left_alone() -> None:
    pausing, switch, _ = make()
    pausing.assigned({P2})
    pausing.forget({P2})
    pausing.update(0, {P0})
    assert switch.calls == []


def test_partitions_are_described_by_topic() -> None:
    assert describe_partitions({("b", 1), ("a", 2), ("a", 0)}) == "a[0, 2], b[1]"
    assert describe_partitions(set()) == "nothing"


def test_a_partition_never_paused_here_is_not_resumed_when_assigned() -> None:
    """A resume restarts the partition's fetcher (most of a second without records)."""
    pausing, switch, _ = make()
    pausing.assigned({P0, P1})
    pausing.update(0, {P0, P1})
    assert switch.calls == []
