"""A member joining a group that serves: how many rounds its partitions take to reach it.

Under ``cooperative-sticky`` the old member revokes only what is to move, and the join
usually takes two rounds: the first hands the new member nothing while the old one
revokes, and only the second assigns it; the partitions in between are nobody's, and
librdkafka sends the new member's second JoinGroup no sooner than a second after its
first. Under ``[kafka] assignor =
"roundrobin"`` one round hands the new member its share at once: the old member revokes
everything and is given its share back in the same rebalance. A member offering another
assignor than the group's is refused."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import Topics
from worker.config import KafkaSettings
from worker.kafka import Source, consumer_config

pytestmark = pytest.mark.integration


class Rebalances:
    """Every rebalance callback a member's ``Source`` hears, in order, by partition."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.owned: set[int] = set()

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", sorted(tp.partition for tp in partitions)))
        self.owned |= {tp.partition for tp in partitions}

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("revoke", sorted(tp.partition for tp in partitions)))
        self.owned -= {tp.partition for tp in partitions}

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("lost", sorted(tp.partition for tp in partitions)))
        self.owned -= {tp.partition for tp in partitions}


def member(bootstrap: str, topics: Topics, assignor: str) -> tuple[Source, Rebalances]:
    settings = KafkaSettings(
        bootstrap_servers=bootstrap,
        group_id=topics.group,
        assignor=assignor,  # type: ignore[arg-type]
        session_timeout_ms=10_000,
        heartbeat_interval_ms=200,
    )
    source = Source(Consumer(consumer_config(settings)), [topics.requests])
    heard = Rebalances()
    source.subscribe(heard)
    return source, heard


def serve_until(done: Callable[[], bool], sources: list[Source], turns: int = 300) -> bool:
    for _ in range(turns):
        if done():
            return True
        for source in sources:
            source.consume(10, 0.05)
    return done()


def join(
    bootstrap: str, topics: Topics, assignor: str, old_calls: int
) -> tuple[Rebalances, Rebalances]:
    """A member owning all four partitions, then a second one, served until the second
    owns two and the first has heard ``old_calls`` rebalance callbacks."""
    old, old_heard = member(bootstrap, topics, assignor)
    sources = [old]
    try:
        assert serve_until(lambda: old_heard.owned == {0, 1, 2, 3}, sources)
        joiner, joiner_heard = member(bootstrap, topics, assignor)
        sources.append(joiner)
        assert serve_until(lambda: len(joiner_heard.owned) == 2, sources)
        assert serve_until(lambda: len(old_heard.calls) >= old_calls, sources)
        assert not old_heard.owned & joiner_heard.owned
        assert old_heard.owned | joiner_heard.owned == {0, 1, 2, 3}
        heard = old_heard.calls[:], joiner_heard.calls[:]
    finally:
        for source in sources:
            source.close()  # its revoke is heard too: what came before is returned
    old_heard.calls, joiner_heard.calls = heard
    return old_heard, joiner_heard


def shapes(heard: Rebalances) -> list[tuple[str, int]]:
    """Each callback by kind and number of partitions: which half moves depends on the
    order of the member ids."""
    return [(kind, len(partitions)) for kind, partitions in heard.calls]


def test_under_roundrobin_a_joining_member_gets_its_share_in_one_round(
    kafka_bootstrap: str, fresh_topics: Callable[..., Topics]
) -> None:
    old, joiner = join(kafka_bootstrap, fresh_topics(4), "roundrobin", old_calls=3)
    assert shapes(joiner) == [("assign", 2)]
    assert shapes(old) == [("assign", 4), ("revoke", 4), ("assign", 2)]


def test_under_cooperative_sticky_only_the_partitions_that_move_are_revoked(
    kafka_bootstrap: str, fresh_topics: Callable[..., Topics]
) -> None:
    """Usually in two rounds, the first assigning the new member nothing (its callbacks
    then read ``[("assign", 0), ("assign", 2)]``); now and then the coordinator's first
    round already hands it the two."""
    old, joiner = join(kafka_bootstrap, fresh_topics(4), "cooperative-sticky", old_calls=2)
    moved = set(old.calls[1][1])
    assert old.calls[:2] == [("assign", [0, 1, 2, 3]), ("revoke", sorted(moved))]
    assert all(kind == "assign" and not partitions for kind, partitions in old.calls[2:])
    assert joiner.calls[-1] == ("assign", sorted(moved))
    assert all(not partitions for _, partitions in joiner.calls[:-1])


def test_a_member_offering_another_assignor_is_refused_and_says_why(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Why a group changes its assignor all at once: the coordinator refuses a member
    whose assignor no member of the group offers, and the members keep what they own."""
    topics = fresh_topics(4)
    old, old_heard = member(kafka_bootstrap, topics, "cooperative-sticky")
    sources = [old]
    try:
        assert serve_until(lambda: old_heard.owned == {0, 1, 2, 3}, sources)
        other, other_heard = member(kafka_bootstrap, topics, "roundrobin")
        sources.append(other)
        with caplog.at_level(logging.WARNING, logger="worker.kafka.source"):
            assert serve_until(lambda: "offer another assignor" in caplog.text, sources)
        assert other_heard.calls == []
        assert old_heard.owned == {0, 1, 2, 3}
    finally:
        for source in sources:
            source.close()
