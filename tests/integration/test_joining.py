"""A member joining a group that serves: how many rounds its partitions take to reach it.

Under ``cooperative-sticky`` the join takes two rounds: the first hands the new member
nothing while the old one revokes what is to move, and only the second assigns it; the
partitions in between are nobody's, and librdkafka sends the new member's second
JoinGroup no sooner than a second after its first. Under ``[kafka] assignor =
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


@pytest.mark.parametrize(
    ("assignor", "joiner_hears", "old_member_hears"),
    [
        (
            "cooperative-sticky",
            [("assign", 0), ("assign", 2)],
            [("assign", 4), ("revoke", 2), ("assign", 0), ("assign", 0)],
        ),
        ("roundrobin", [("assign", 2)], [("assign", 4), ("revoke", 4), ("assign", 2)]),
    ],
)
def test_a_joining_member_gets_its_partitions_in_the_rounds_of_its_assignor(
    assignor: str,
    joiner_hears: list[tuple[str, int]],
    old_member_hears: list[tuple[str, int]],
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
) -> None:
    """Each callback by kind and number of partitions: which half moves depends on the
    order of the member ids."""
    topics = fresh_topics(4)
    old, old_heard = member(kafka_bootstrap, topics, assignor)
    sources = [old]
    try:
        assert serve_until(lambda: old_heard.owned == {0, 1, 2, 3}, sources)
        joiner, joiner_heard = member(kafka_bootstrap, topics, assignor)
        sources.append(joiner)
        assert serve_until(lambda: len(joiner_heard.owned) == 2, sources)
        assert serve_until(lambda: len(old_heard.calls) >= len(old_member_hears), sources)
        assert [(kind, len(ps)) for kind, ps in joiner_heard.calls] == joiner_hears
        assert [(kind, len(ps)) for kind, ps in old_heard.calls] == old_member_hears
        assert not old_heard.owned & joiner_heard.owned
        assert old_heard.owned | joiner_heard.owned == {0, 1, 2, 3}
    finally:
        for source in sources:
            source.close()


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
