"""Feature assembly: one store call per batch, float32 matrix, per-row rejections; how
Redis errors are sorted into a record's, an outage and a configuration problem."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import numpy.typing as npt
import pytest
import redis
from prometheus_client import CollectorRegistry
from redis._parsers import BaseParser

from worker.compose import Metrics
from worker.config import FeatureSpec, ModelSpec, PipelineConfig
from worker.core.types import DecodedRequests
from worker.errors import FeatureStoreConfigError, FeatureStoreError
from worker.features.lookups import OneStore, RedisLookups
from worker.features.redis_io import REDIS_ERROR_KINDS, RedisTrouble, classify_redis_error
from worker.features.store_wait import StoreWait
from worker.features.stores import (
    PROBE_ENTITY,
    FeatureStore,
    RedisHashStore,
    RedisPackedStore,
    RowStore,
    pack_vector,
)
from worker.inference.engine import TensorInput
from worker.models import build_pipeline
from worker.ops.health import HealthState
from worker.pipeline.codec import ENTITY_PATTERN
from worker.pipeline.feeds import Assembled, FeedPlan
from worker.pipeline.feeds import assemble as assemble_feeds
from worker.pipeline.steps import Pipeline

if TYPE_CHECKING:
    from tests.fakes.stores import MemoryStore, StoreFactory

FIELDS = ["a", "b", "c"]

STORED: dict[str, dict[str, bytes | str]] = {
    # deliberately not in field order: assembly must follow the spec's order
    "e1": {"c": b"3", "a": b"1", "b": b"2"},
    "e2": {"a": b"10.5", "b": b"-20", "c": b"3e2"},
    "partial": {"a": b"7"},  # b and c absent
    "text": {"a": "4", "b": "5", "c": "6"},  # a client with decode_responses=True
    "bad": {"a": b"1", "b": b"twelve", "c": b"3"},
    "nan": {"a": b"nan", "b": b"1", "c": b"1"},
    "inf": {"a": b"1", "b": b"-inf", "c": b"1"},
}

SpecFactory = Callable[..., FeatureSpec]


@pytest.fixture
def make_spec() -> SpecFactory:
    def make(**kw: Any) -> FeatureSpec:
        return FeatureSpec(fields=FIELDS, **kw)

    return make


@pytest.fixture
def store(make_store: StoreFactory) -> MemoryStore:
    return make_store(STORED, FIELDS)


MATRIX = TensorInput("input", "tensor(float)", np.dtype(np.float32), 2, None)


@dataclass(frozen=True)
class Enriched:
    """``feeds.assemble`` for a one-lookup pipeline whose model takes one float matrix."""

    matrix: npt.NDArray[np.float32]
    rejected: list[tuple[int, str, str]]
    lookups: int
    misses: int


def assemble(
    spec: FeatureSpec,
    entities: Sequence[str | None],
    inline: Sequence[dict[str, Any] | None],
    store: FeatureStore,
) -> Enriched:
    config = PipelineConfig(
        name="p",
        request_topics=["req"],
        result_topic="res",
        dead_letter_topic="dlq",
        features=spec,
        model=ModelSpec(path=Path("unused.onnx"), name="m"),
    )
    decoded = DecodedRequests(
        rows=list(range(len(entities))),
        ids=[f"r{i}" for i in range(len(entities))],
        entities={"entity": list(entities)},
        inline=list(inline),
    )
    out: Assembled = assemble_feeds(
        FeedPlan.build(config, [MATRIX]), decoded, OneStore("entity", store)
    )
    return Enriched(out.feeds["input"], out.rejected, out.lookups, out.misses)


def rows_of(rejected: Sequence[tuple[int, str, str]]) -> dict[int, str]:
    return {r: code for r, code, _ in rejected}


def test_one_store_call_with_distinct_entities(make_spec: SpecFactory, store: MemoryStore) -> None:
    entities: list[str | None] = ["e1", "e2", "e1", "e2", "e1"]
    out = assemble(make_spec(), entities, [None] * 5, store)
    assert store.calls == [["e1", "e2"]]
    assert out.rejected == []
    assert out.matrix.dtype == np.float32
    assert out.matrix.shape == (5, 3)
    e1 = [1.0, 2.0, 3.0]
    e2 = [10.5, -20.0, 300.0]
    np.testing.assert_array_equal(out.matrix, np.array([e1, e2, e1, e2, e1], dtype=np.float32))


def test_str_values_are_parsed_too(make_spec: SpecFactory, store: MemoryStore) -> None:
    out = assemble(make_spec(), ["text"], [None], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[4.0, 5.0, 6.0]])


def test_inline_features_override_stored(make_spec: SpecFactory, store: MemoryStore) -> None:
    out = assemble(make_spec(), ["e1", "e1"], [{"b": -0.5}, None], store)
    assert store.calls == [["e1"]]
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[1.0, -0.5, 3.0], [1.0, 2.0, 3.0]])


def test_complete_inline_without_entity_needs_no_lookup(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(), [None], [{"c": 3.0, "a": 1.0, "b": 2.0}], store)
    assert store.calls == []
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[1.0, 2.0, 3.0]])


def test_complete_inline_with_entity_needs_no_lookup(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(), ["ghost"], [{"a": 1.0, "b": 2.0, "c": 3.0}], store)
    assert store.calls == []
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[1.0, 2.0, 3.0]])


def test_only_rows_needing_lookup_are_looked_up(make_spec: SpecFactory, store: MemoryStore) -> None:
    entities: list[str | None] = [None, "e2", "e1"]
    inline: list[dict[str, float] | None] = [
        {"a": 0.0, "b": 0.0, "c": 0.0},
        None,
        {"a": 9.0, "b": 9.0, "c": 9.0},
    ]
    out = assemble(make_spec(), entities, inline, store)
    assert store.calls == [["e2"]]
    np.testing.assert_array_equal(out.matrix, [[0, 0, 0], [10.5, -20, 300], [9, 9, 9]])


def test_empty_batch(make_spec: SpecFactory, store: MemoryStore) -> None:
    out = assemble(make_spec(), [], [], store)
    assert out.matrix.shape == (0, 3)
    assert out.rejected == []
    assert store.calls == []


def test_unknown_entity_dead_letter(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_entity="dead_letter")
    out = assemble(spec, ["e1", "ghost", "e2"], [None, None, None], store)
    assert store.calls == [["e1", "ghost", "e2"]]
    assert len(out.rejected) == 1
    row, code, reason = out.rejected[0]
    assert (row, code) == (1, "unknown_entity")
    assert "'ghost'" in reason
    np.testing.assert_array_equal(out.matrix[[0, 2]], [[1, 2, 3], [10.5, -20, 300]])


def test_unknown_entity_with_partial_inline_still_dead_letter(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(on_missing_entity="dead_letter"), ["ghost"], [{"a": 1.0}], store)
    assert rows_of(out.rejected) == {0: "unknown_entity"}


def test_unknown_entity_default(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_entity="default", default_value=-7.0)
    out = assemble(spec, ["ghost", "e1"], [None, {"c": 0.25}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[-7, -7, -7], [1, 2, 0.25]])


def test_unknown_entity_default_keeps_inline(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_entity="default", default_value=-1.0)
    out = assemble(spec, ["ghost"], [{"b": 5.0}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[-1, 5, -1]])


def test_missing_field_default(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_field="default", default_value=0.5)
    out = assemble(spec, ["partial"], [None], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[7.0, 0.5, 0.5]])


def test_missing_field_dead_letter(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_field="dead_letter")
    out = assemble(spec, ["e1", "partial"], [None, None], store)
    assert len(out.rejected) == 1
    row, code, reason = out.rejected[0]
    assert (row, code) == (1, "missing_feature")
    assert "'partial'" in reason
    assert "['b', 'c']" in reason


def test_missing_field_dead_letter_names_only_fields_not_inline(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    spec = make_spec(on_missing_field="dead_letter")
    out = assemble(spec, ["partial"], [{"b": 1.0}], store)
    (_, code, reason) = out.rejected[0]
    assert code == "missing_feature"
    assert "['c']" in reason


def test_missing_field_supplied_inline_is_not_rejected(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    spec = make_spec(on_missing_field="dead_letter")
    out = assemble(spec, ["partial"], [{"b": 2.0, "c": 3.0}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[7.0, 2.0, 3.0]])


def test_missing_entity_policy_does_not_apply_to_partial_entity(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    spec = make_spec(on_missing_entity="dead_letter", on_missing_field="default")
    out = assemble(spec, ["partial"], [None], store)
    assert out.rejected == []


def test_non_numeric_stored_value_rejects_that_row_only(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    entities: list[str | None] = ["e1", "bad", "e2", "bad"]
    out = assemble(make_spec(), entities, [None] * 4, store)
    assert rows_of(out.rejected) == {1: "bad_feature_value", 3: "bad_feature_value"}
    reason = next(why for r, _, why in out.rejected if r == 1)
    assert "twelve" in reason
    np.testing.assert_array_equal(out.matrix[[0, 2]], [[1, 2, 3], [10.5, -20, 300]])


@pytest.mark.parametrize("entity", ["nan", "inf"])
def test_non_finite_stored_value(make_spec: SpecFactory, store: MemoryStore, entity: str) -> None:
    out = assemble(make_spec(), ["e1", entity], [None, None], store)
    assert rows_of(out.rejected) == {1: "non_finite"}


def test_non_finite_value_overridden_inline_is_fine(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(), ["nan"], [{"a": 2.0}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[2.0, 1.0, 1.0]])


def test_store_error_propagates(make_spec: SpecFactory) -> None:
    class DownStore(RowStore):
        fields = ("a", "b", "c")

        def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
            raise FeatureStoreError("connection refused")

    with pytest.raises(FeatureStoreError, match="connection refused"):
        assemble(make_spec(), ["e1"], [None], DownStore())


@pytest.mark.parametrize(
    ("entity", "inline"),
    [("e1", {"a": 1e39}), ("huge", None)],
    ids=["inline", "stored"],
)
def test_value_beyond_float32_range_is_non_finite(
    make_spec: SpecFactory,
    make_store: StoreFactory,
    entity: str,
    inline: dict[str, float] | None,
) -> None:
    store = make_store({**STORED, "huge": {"a": b"1e39", "b": b"1", "c": b"1"}}, FIELDS)
    out = assemble(make_spec(), [entity], [inline], store)
    assert rows_of(out.rejected) == {0: "non_finite"}


def test_store_answering_too_few_rows_is_a_store_error(make_spec: SpecFactory) -> None:
    class ShortStore(RowStore):
        fields = ("a", "b", "c")

        def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
            return [[b"1", b"2", b"3"]]

    with pytest.raises(FeatureStoreError):
        assemble(make_spec(), ["e1", "e2"], [None, None], ShortStore())


# --- Redis errors: whose problem is it? ------------------------------------------------
#
# The stores below talk to a fake connection that answers scripted replies; the error
# replies are parsed by redis-py's own parser, so they carry what a real one would.


def reply_error(text: str) -> redis.RedisError:
    """The exception redis-py makes of the error reply ``-<text>``."""
    error: redis.RedisError = BaseParser.parse_error(text)
    return error


class FakeConnection:
    """Answers scripted replies in order; an exception instance is raised instead.

    Like redis-py's connection, an error *reply* (ResponseError) is raised after the whole
    reply was read, so the connection stays in step; a connection-level error (LOADING,
    NOAUTH ...) is raised by the parser itself.
    """

    def __init__(self, replies: Sequence[object]) -> None:
        self.replies = list(replies)
        self.sent: list[bytes] = []
        self.disconnected = False

    def send_packed_command(self, parts: Sequence[bytes]) -> None:
        self.sent.append(b"".join(parts))

    def read_response(self) -> object:
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def disconnect(self) -> None:
        self.disconnected = True


class FakePool:
    def __init__(
        self, conn: FakeConnection, username: str | None, refuse: BaseException | None
    ) -> None:
        self.conn, self.refuse = conn, refuse
        self.connection_kwargs: dict[str, Any] = {"username": username}
        self.released: list[FakeConnection] = []

    def get_connection(self) -> FakeConnection:
        if self.refuse is not None:
            raise self.refuse
        return self.conn

    def release(self, conn: FakeConnection) -> None:
        self.released.append(conn)


class FakeRedis:
    def __init__(
        self,
        replies: Sequence[object] = (),
        *,
        username: str | None = None,
        refuse: BaseException | None = None,
    ) -> None:
        self.conn = FakeConnection(replies)
        self.connection_pool = FakePool(self.conn, username, refuse)


def hash_store(client: FakeRedis) -> RedisHashStore:
    return RedisHashStore(cast(redis.Redis, client), FeatureSpec(fields=FIELDS))


def packed_store(client: FakeRedis) -> RedisPackedStore:
    spec = FeatureSpec(fields=FIELDS, layout="packed")
    return RedisPackedStore(cast(redis.Redis, client), spec)


WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOPERM_COMMAND = "NOPERM this user has no permissions to run the 'hmget' command"
NOPERM_KEY = "NOPERM this user has no permissions to access one of the keys used as arguments"


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        pytest.param(WRONGTYPE, "record", id="WRONGTYPE"),
        pytest.param("LOADING Redis is loading the dataset in memory", "outage", id="LOADING"),
        pytest.param("BUSY Redis is busy running a script.", "outage", id="BUSY"),
        pytest.param("MASTERDOWN Link with MASTER is down", "outage", id="MASTERDOWN"),
        pytest.param("TRYAGAIN Multiple keys request during rehashing", "outage", id="TRYAGAIN"),
        pytest.param("CLUSTERDOWN The cluster is down", "outage", id="CLUSTERDOWN"),
        pytest.param("ERR max number of clients reached", "outage", id="max-clients"),
        pytest.param(NOPERM_COMMAND, "config", id="NOPERM-command"),
        pytest.param(NOPERM_KEY, "config", id="NOPERM-key"),
        pytest.param("NOAUTH Authentication required.", "config", id="NOAUTH"),
        pytest.param("WRONGPASS invalid username-password pair", "config", id="WRONGPASS"),
        pytest.param("ERR invalid password", "config", id="invalid-password"),
        pytest.param("CROSSSLOT Keys in request don't hash to the same slot", "config"),
        pytest.param("MOVED 3999 127.0.0.1:6381", "config", id="MOVED"),
        pytest.param("ASK 3999 127.0.0.1:6381", "config", id="ASK"),
        pytest.param("ERR unknown command 'HMGET', with args beginning with: ", "config"),
        pytest.param("ERR wrong number of arguments for 'hmget' command", "config"),
        pytest.param("SOMETHINGNEW nobody has seen this", "config", id="unknown-code"),
    ],
)
def test_redis_error_replies_are_classified(reply: str, kind: RedisTrouble) -> None:
    got, code = classify_redis_error(reply_error(reply))
    assert got == kind
    assert code == reply.split(" ", 1)[0]


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
        redis.TimeoutError("Timeout reading from 127.0.0.1:6379"),
        redis.exceptions.InvalidResponse("Protocol Error: b'?'"),
    ],
    ids=["refused", "timeout", "garbled"],
)
def test_connection_failures_are_outages(exc: redis.RedisError) -> None:
    assert classify_redis_error(exc)[0] == "outage"


def test_every_listed_code_has_a_kind_and_the_required_ones_are_there() -> None:
    assert set(REDIS_ERROR_KINDS.values()) <= {"record", "outage", "config"}
    assert {c for c, k in REDIS_ERROR_KINDS.items() if k == "record"} == {"WRONGTYPE"}
    for code in ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"):
        assert REDIS_ERROR_KINDS[code] == "outage"
    for code in ("NOPERM", "NOAUTH", "WRONGPASS", "CROSSSLOT", "MOVED", "ASK"):
        assert REDIS_ERROR_KINDS[code] == "config"


def test_wrongtype_refuses_that_entity_only_in_one_round_trip() -> None:
    client = FakeRedis([[b"1", b"2", b"3"], reply_error(WRONGTYPE), [b"4", None, b"6"]])
    fetched = hash_store(client).fetch(["e1", "str", "e3"])
    assert len(client.conn.sent) == 1  # one pipelined write for the batch
    assert client.conn.sent[0].count(b"HMGET") == 3
    assert client.conn.replies == []  # every reply read: the connection stays in step
    assert not client.conn.disconnected
    assert client.connection_pool.released == [client.conn]
    assert fetched.bad[0] is None and fetched.bad[2] is None
    assert fetched.bad[1] is not None
    code, reason = fetched.bad[1]
    assert code == "feature_store_error"
    assert "WRONGTYPE" in reason and "'features:str'" in reason
    np.testing.assert_array_equal(fetched.values[[0, 2]], [[1, 2, 3], [4, 0, 6]])
    assert fetched.absent[2].tolist() == [False, True, False]


def test_wrongtype_becomes_a_dead_letter_code_in_assemble(make_spec: SpecFactory) -> None:
    client = FakeRedis([[b"1", b"2", b"3"], reply_error(WRONGTYPE)])
    entities: list[str | None] = ["e1", "str", "e1", "str"]
    out = assemble(make_spec(), entities, [None] * 4, hash_store(client))
    assert rows_of(out.rejected) == {1: "feature_store_error", 3: "feature_store_error"}
    assert all("WRONGTYPE" in why for _, _, why in out.rejected)
    np.testing.assert_array_equal(out.matrix[[0, 2]], [[1, 2, 3], [1, 2, 3]])


def test_unparsable_value_keeps_its_own_code_beside_a_refused_key(
    make_spec: SpecFactory,
) -> None:
    client = FakeRedis([[b"1", b"x", b"3"], reply_error(WRONGTYPE)])
    out = assemble(make_spec(), ["bad", "str"], [None, None], hash_store(client))
    assert rows_of(out.rejected) == {0: "bad_feature_value", 1: "feature_store_error"}


@pytest.mark.parametrize("reply", [NOPERM_COMMAND, NOPERM_KEY])
def test_noperm_is_a_config_error_saying_what_to_grant(reply: str) -> None:
    client = FakeRedis([[b"1", b"2", b"3"], reply_error(reply)], username="svc")
    with pytest.raises(FeatureStoreConfigError) as caught:
        hash_store(client).fetch(["e1", "e2"])
    message = str(caught.value)
    assert "NOPERM" in message
    assert "ACL SETUSER svc +hmget ~features:*" in message
    assert not client.conn.disconnected  # a refusal is a whole reply: no need to reconnect


def test_noperm_without_a_username_names_the_default_user() -> None:
    client = FakeRedis([reply_error(NOPERM_COMMAND)])
    with pytest.raises(FeatureStoreConfigError, match=r"ACL SETUSER default \+hmget"):
        hash_store(client).fetch(["e1"])


def test_config_refusal_outranks_an_outage_and_a_record_problem_in_the_same_batch() -> None:
    client = FakeRedis(
        [reply_error(WRONGTYPE), reply_error("BUSY Redis is busy"), reply_error(NOPERM_KEY)]
    )
    with pytest.raises(FeatureStoreConfigError, match="NOPERM"):
        hash_store(client).fetch(["a", "b", "c"])


def test_transient_reply_is_an_outage_not_a_config_error() -> None:
    client = FakeRedis([reply_error(WRONGTYPE), reply_error("BUSY Redis is busy")])
    with pytest.raises(FeatureStoreError, match="BUSY") as caught:
        hash_store(client).fetch(["a", "b"])
    assert not isinstance(caught.value, FeatureStoreConfigError)


def test_loading_raised_mid_read_is_an_outage_and_drops_the_connection() -> None:
    client = FakeRedis([[b"1", b"2", b"3"], reply_error("LOADING Redis is loading")])
    with pytest.raises(FeatureStoreError, match="LOADING") as caught:
        hash_store(client).fetch(["e1", "e2", "e3"])
    assert not isinstance(caught.value, FeatureStoreConfigError)
    assert client.conn.disconnected  # replies were left unread: never reuse it


def test_refused_credentials_at_connect_are_a_config_error() -> None:
    client = FakeRedis(refuse=reply_error("WRONGPASS invalid username-password pair"))
    with pytest.raises(FeatureStoreConfigError, match=r"redis\.password"):
        hash_store(client).fetch(["e1"])


def test_unreachable_at_connect_is_an_outage() -> None:
    client = FakeRedis(refuse=redis.ConnectionError("Error 111 connecting"))
    with pytest.raises(FeatureStoreError, match="not reachable") as caught:
        hash_store(client).fetch(["e1"])
    assert not isinstance(caught.value, FeatureStoreConfigError)


def test_cluster_redirect_is_a_config_error() -> None:
    client = FakeRedis([reply_error("MOVED 3999 10.0.0.2:6381")])
    with pytest.raises(FeatureStoreConfigError, match="Cluster"):
        hash_store(client).fetch(["e1"])


def test_packed_mget_refusal_is_a_config_error_naming_mget() -> None:
    client = FakeRedis([reply_error(NOPERM_COMMAND.replace("hmget", "mget"))])
    with pytest.raises(FeatureStoreConfigError, match=r"ACL SETUSER default \+mget ~features:\*"):
        packed_store(client).fetch(["e1", "e2"])


def test_packed_mget_error_about_some_key_cannot_be_pinned_on_one_record() -> None:
    # MGET answers one reply for every key: an error in it is the batch's, never one
    # record's; it must not dead-letter the whole batch.
    client = FakeRedis([reply_error(WRONGTYPE)])
    with pytest.raises(FeatureStoreConfigError, match="WRONGTYPE"):
        packed_store(client).fetch(["e1", "e2"])


def test_packed_wrong_length_is_a_bad_value_of_that_entity() -> None:
    client = FakeRedis([[pack_vector([1, 2, 3]), b"\x00" * 5]])
    fetched = packed_store(client).fetch(["e1", "e2"])
    assert fetched.bad[0] is None
    assert fetched.bad[1] is not None and fetched.bad[1][0] == "bad_feature_value"


@pytest.mark.parametrize(
    ("make", "command"),
    [(hash_store, b"HMGET"), (packed_store, b"MGET")],
    ids=["hash", "packed"],
)
def test_probe_sends_the_batch_command_for_a_valid_probe_key(
    make: Callable[[FakeRedis], RedisHashStore | RedisPackedStore], command: bytes
) -> None:
    client = FakeRedis([[None, None, None] if command == b"HMGET" else [None]])
    make(client).probe()
    (sent,) = client.conn.sent
    assert command in sent
    assert f"features:{PROBE_ENTITY}".encode() in sent
    assert re.fullmatch(ENTITY_PATTERN, PROBE_ENTITY)


def test_probe_fails_on_noperm() -> None:
    client = FakeRedis([reply_error(NOPERM_KEY)])
    with pytest.raises(FeatureStoreConfigError, match="NOPERM"):
        hash_store(client).probe()


def test_probe_passes_when_the_probe_key_itself_has_the_wrong_type() -> None:
    hash_store(FakeRedis([reply_error(WRONGTYPE)])).probe()  # allowed, just odd data


# --- the pipeline waits out a configuration refusal, without dead letters ---------------


class _Msg:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


class _Engine:
    inputs: ClassVar = [MATRIX]
    model_hash = "0" * 64

    def infer(self, feeds: Any) -> dict[str, Any]:
        return {}

    def warm_up(self, batch_sizes: Any, example: Any = None) -> None:
        return None


class RefusingStore(RowStore):
    """Refuses the first ``times`` fetches with ``error``, then answers from memory."""

    fields = FIELDS

    def __init__(self, times: int, error: Exception) -> None:
        self.times, self.error, self.calls = times, error, 0

    def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return [[b"1", b"2", b"3"] for _ in entities]


def make_pipeline(store: RowStore, **kw: Any) -> Pipeline:
    config = PipelineConfig(
        name="p",
        request_topics=["req"],
        result_topic="res",
        dead_letter_topic="dlq",
        features=FeatureSpec(fields=FIELDS),
        model=ModelSpec(path=Path("unused.onnx"), name="m"),
    )
    metrics = Metrics(CollectorRegistry()).for_pipeline("p")
    plan = FeedPlan.build(config, _Engine.inputs)
    return build_pipeline(config, store=store, engine=_Engine(), plan=plan, metrics=metrics, **kw)


BATCH = [_Msg(b'{"id": "r1", "entity": "e1"}'), _Msg(b'{"id": "r2", "entity": "e2"}')]
REFUSED = "Redis refused HMGET: NOPERM this user has no permissions; grant it"


@pytest.fixture
def quick_config_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StoreWait, "CONFIG_RETRY_S", (0.001, 0.002))


@pytest.mark.usefixtures("quick_config_retry")
def test_config_refusal_waits_with_a_reason_and_never_dead_letters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RefusingStore(3, FeatureStoreConfigError(REFUSED))
    heard: list[tuple[bool, str | None]] = []
    # No time at all for outages: a configuration refusal is not bound by it.
    pipeline = make_pipeline(
        store, retry_feature_store_s=0.0, on_feature_store=lambda ok, why: heard.append((ok, why))
    )
    with caplog.at_level(logging.INFO, logger="worker.features.store_wait"):
        prepared = pipeline.prepare(BATCH)  # type: ignore[arg-type]
    assert store.calls == 4
    assert prepared.rows.rejected == []
    assert prepared.rows.good.tolist() == [0, 1]
    assert heard == [(False, REFUSED), (True, None)]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # the same refusal three times is logged once
    assert "NOPERM" in errors[0].getMessage()


@pytest.mark.usefixtures("quick_config_retry")
def test_readiness_carries_the_refusal_until_the_store_answers() -> None:
    health = HealthState()
    health.models_loaded = health.joined = health.broker_ok = True
    seen: list[list[str]] = []

    class Watching(RefusingStore):
        def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
            seen.append(health.not_ready_reasons())
            return super().get_many(entities)

    pipeline = make_pipeline(
        Watching(1, FeatureStoreConfigError(REFUSED)), on_feature_store=health.feature_store
    )
    pipeline.prepare(BATCH)  # type: ignore[arg-type]
    assert seen == [[], [f"feature store: {REFUSED}"]]
    assert health.not_ready_reasons() == []


def test_abort_ends_the_wait_on_a_config_refusal() -> None:
    abort = threading.Event()
    abort.set()
    store = RefusingStore(10, FeatureStoreConfigError(REFUSED))
    pipeline = make_pipeline(store, abort=abort)
    with pytest.raises(FeatureStoreConfigError):
        pipeline.prepare(BATCH)  # type: ignore[arg-type]
    assert store.calls == 1


def test_outage_still_gives_up_after_its_deadline() -> None:
    store = RefusingStore(10, FeatureStoreError("Redis is not reachable"))
    with pytest.raises(FeatureStoreError):
        make_pipeline(store, retry_feature_store_s=0.0).prepare(BATCH)  # type: ignore[arg-type]
    assert store.calls == 1


# --- several lookups, one round trip ---------------------------------------------------


def test_a_hash_and_a_packed_lookup_share_one_write_and_split_the_replies() -> None:
    user = FeatureSpec(key_template="u:{entity}", fields=["age", "country"])
    merchant = FeatureSpec(key_template="m:{entity}", fields=["risk"], layout="packed")
    client = FakeRedis(
        [
            [b"40", b"FR"],  # HMGET u:u1
            redis.ResponseError(WRONGTYPE),  # HMGET u:u2
            [pack_vector([0.5]), None],  # MGET m:m1 m:m9
        ]
    )
    raw = cast(redis.Redis, client)
    lookups = RedisLookups(
        raw,
        {
            "user": RedisHashStore(raw, user, text_fields=["country"]),
            "merchant": RedisPackedStore(raw, merchant),
        },
    )
    got = lookups.fetch_all({"user": ["u1", "u2"], "merchant": ["m1", "m9"]})
    assert len(client.conn.sent) == 1  # one write: both lookups' commands
    sent = client.conn.sent[0]
    assert sent.count(b"$5\r\nHMGET") == 2 and sent.count(b"$4\r\nMGET") == 1
    assert got["user"].values[0, 0] == 40.0
    assert got["user"].text is not None and got["user"].text[0, 1] == "FR"
    assert got["user"].bad[0] is None
    assert got["user"].bad[1] is not None and "WRONGTYPE" in got["user"].bad[1][1]
    assert "'u:u2'" in got["user"].bad[1][1]
    assert got["merchant"].values[0, 0] == np.float32(0.5)
    assert got["merchant"].absent.tolist() == [[False], [True]]
