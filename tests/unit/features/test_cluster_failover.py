"""A Redis Cluster primary gone: the batch waits as for an outage, and the slot map is
asked for again so that the next try reaches the replica promoted in its place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from worker.errors import FeatureStoreConfigError, FeatureStoreError
from worker.features.redis_io import Command, cluster_round_trip

COMMAND = Command("HMGET", "features:*", "default")


@dataclass
class Pool:
    """A node's connection pool; a dead node refuses every connection."""

    dead: bool

    def get_connection(self) -> Any:
        if self.dead:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:7001")
        return Conn()

    def release(self, conn: Any) -> None:
        pass


class Conn:
    def send_packed_command(self, parts: list[bytes]) -> None:
        self.sent = parts

    def read_response(self) -> Any:
        return [b"1.0"]

    def disconnect(self) -> None:
        pass


@dataclass
class Node:
    name: str
    dead: bool

    @property
    def redis_connection(self) -> Any:
        return type("R", (), {"connection_pool": Pool(self.dead)})()


@dataclass
class NodesManager:
    """Every slot on one primary until ``initialize`` learns of the promoted replica."""

    primary: Node
    promoted: Node | None = None
    refreshed: int = 0

    def get_node_from_slot(self, slot: int) -> Node:
        return self.primary

    def initialize(self) -> None:
        self.refreshed += 1
        if self.promoted is not None:
            self.primary = self.promoted


@dataclass
class FakeCluster:
    nodes_manager: NodesManager = field(default_factory=lambda: NodesManager(Node("a", True)))


def test_a_dead_primary_is_an_outage_after_which_the_slot_map_is_refreshed() -> None:
    client = FakeCluster()
    with pytest.raises(FeatureStoreError, match="Redis Cluster round trip") as caught:
        cluster_round_trip(client, [b"HMGET k f"], [b"k"], COMMAND)  # type: ignore[arg-type]
    assert not isinstance(caught.value, FeatureStoreConfigError)
    assert client.nodes_manager.refreshed == 1


def test_a_refreshed_map_naming_the_promoted_replica_is_tried_at_once() -> None:
    client = FakeCluster()
    client.nodes_manager.promoted = Node("b", False)
    answers, errors = cluster_round_trip(client, [b"HMGET k f"], [b"k"], COMMAND)  # type: ignore[arg-type]
    assert (answers, errors) == ([[b"1.0"]], {})
    assert client.nodes_manager.refreshed == 1
    cluster_round_trip(client, [b"HMGET k f"], [b"k"], COMMAND)  # type: ignore[arg-type]
    assert client.nodes_manager.refreshed == 1, "a batch served asks for no map"


def test_a_promoted_replica_that_fails_too_is_an_outage() -> None:
    client = FakeCluster()
    client.nodes_manager.promoted = Node("b", True)
    with pytest.raises(FeatureStoreError, match="Redis Cluster round trip"):
        cluster_round_trip(client, [b"HMGET k f"], [b"k"], COMMAND)  # type: ignore[arg-type]
    assert client.nodes_manager.refreshed == 1, "one refresh per try, not a loop"
