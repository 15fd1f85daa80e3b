"""PausingManager: pause every owned partition at the bound, resume at half, and give every
newly assigned partition the worker's current state (librdkafka keeps a pause through a
revoke and a later re-assignment)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.core.types import PartitionKey
from worker.loop.pausing import (
    SHARE_FETCH_WAIT_MS,
    PausingManager,
    Share,
    describe_partitions,
    share_fetch_options,
)

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


# --- a pipeline's share of the bound ------------------------------------------------------

B0, B1 = ("bulk", 0), ("bulk", 1)
SHARE = Share.of("bulk", {"bulk"}, records=50, batch=20)  # pauses at 50, resumes at 30


def make_shared(bound: int = 100) -> tuple[PausingManager, FakeSwitch, list[tuple[str, bool]]]:
    switch, heard = FakeSwitch(), []
    manager = PausingManager(
        switch, bound, shares=[SHARE], on_share=lambda p, held: heard.append((p, held))
    )
    return manager, switch, heard


def test_a_pipeline_at_its_share_pauses_only_its_own_partitions() -> None:
    pausing, switch, heard = make_shared()
    owned = {P0, P1, B0, B1}
    pausing.update(49, owned, by_pipeline={"bulk": 49})
    assert switch.calls == []
    pausing.update(55, owned, by_pipeline={"bulk": 50})
    assert switch.paused == {B0, B1} and pausing.held == {"bulk"}
    assert not pausing.bound_reached
    pausing.update(40, owned, by_pipeline={"bulk": 31})
    assert switch.paused == {B0, B1}, "resumes only once a batch has drained"
    pausing.update(30, owned, by_pipeline={"bulk": 30})
    assert switch.paused == set() and not pausing.held
    assert heard == [("bulk", True), ("bulk", False)]


def test_the_whole_bound_still_pauses_everything_and_a_share_outlasts_it() -> None:
    pausing, switch, _ = make_shared()
    owned = {P0, B0}
    pausing.update(100, owned, by_pipeline={"bulk": 60})
    assert switch.paused == {P0, B0} and pausing.bound_reached
    pausing.update(50, owned, by_pipeline={"bulk": 45})
    assert switch.paused == {B0}, "the bound let go; the bulk share still holds"
    assert ("resume", {P0}) in switch.calls
    pausing.update(10, owned, by_pipeline={"bulk": 10})
    assert switch.paused == set()


def test_a_partition_of_a_held_pipeline_assigned_meanwhile_is_paused() -> None:
    pausing, switch, _ = make_shared()
    pausing.update(50, {P0, B0}, by_pipeline={"bulk": 50})
    pausing.assigned({B1, P1})
    pausing.update(50, {P0, P1, B0, B1}, by_pipeline={"bulk": 50})
    assert switch.paused == {B0, B1}


def test_counts_of_pipelines_without_a_share_change_nothing() -> None:
    pausing, switch, _ = make_shared()
    pausing.update(90, {P0, B0}, by_pipeline={"req": 90, "bulk": 0})
    assert switch.calls == []


def test_a_share_resumes_at_zero_when_it_is_one_batch() -> None:
    switch = FakeSwitch()
    pausing = PausingManager(switch, 100, shares=[Share.of("bulk", {"bulk"}, 20, batch=20)])
    pausing.update(20, {B0}, by_pipeline={"bulk": 20})
    assert switch.paused == {B0}
    pausing.update(1, {B0}, by_pipeline={"bulk": 1})
    assert switch.paused == {B0}
    pausing.update(0, {B0}, by_pipeline={"bulk": 0})
    assert switch.paused == set()


def test_a_fetch_takes_no_more_than_a_flowing_share_has_room_for() -> None:
    pausing, _switch, _ = make_shared()
    assert pausing.fetch_limit(256, {"bulk": 0}) == 50
    assert pausing.fetch_limit(256, {"bulk": 45}) == 5
    assert pausing.fetch_limit(3, {"bulk": 45}) == 3
    assert pausing.fetch_limit(256, {"bulk": 50}) == 1, "never none: the loop must poll"
    pausing.update(50, {B0, P0}, by_pipeline={"bulk": 50})
    assert pausing.fetch_limit(256, {"bulk": 50}) == 256, "paused: its records stay out"


def test_shares_shorten_the_fetch_wait_unless_the_config_sets_it() -> None:
    assert share_fetch_options({}) == {"fetch.wait.max.ms": SHARE_FETCH_WAIT_MS}
    assert share_fetch_options({"fetch.wait.max.ms": 500, "x": 1}) == {}
