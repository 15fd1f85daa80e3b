"""Records too large, or refused, for what the broker takes: each becomes a dead letter
that fits, the next request still gets its result, the worker keeps running and the
group's committed offsets reach the log end. Against real Apache Kafka and Redis."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, assert_valid, eventually, validator
from worker.kafka.limits import DEFAULT_MESSAGE_MAX_BYTES

pytestmark = pytest.mark.integration

MAX_RECORD_BYTES = 900_000
Request = tuple[str, bytes | None, bytes | None]


def _good(tag: str, entity: str, key: bytes | None = b"k") -> Request:
    return (tag, key, orjson.dumps({"id": tag, "entity": entity}))


def _invalid_json(size: int) -> bytes:
    head = b'{"id": "big", "entity": '
    return head + b"x" * (size - len(head))


@pytest.fixture
def serve(
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> Iterator[Callable[..., tuple[Outcomes, dict[str, str], Topics]]]:
    """Start one worker, call ``started`` once it is assigned, produce ``requests``, read
    every outcome (``reader``: options of the consumer reading them), check the worker
    is still running and has committed everything; then stop it cleanly."""
    workers: list[WorkerProcess] = []

    def run(
        requests: list[Request],
        good: set[str],
        bad: set[str],
        *,
        topics: Topics | None = None,
        reader: dict[str, Any] | None = None,
        started: Callable[[], None] = lambda: None,
        **config: Any,
    ) -> tuple[Outcomes, dict[str, str], Topics]:
        t = topics or fresh_topics(2)
        path = write_config(t, max_record_bytes=MAX_RECORD_BYTES, max_wait_ms=10, **config)
        worker = WorkerProcess(path, tmp_path / "worker.log").start()
        workers.append(worker)
        wait_for_assignment([worker], 2, timeout=60)
        started()
        positions = produce_requests(kafka_bootstrap, t.requests, requests)
        bad_positions = {positions[tag] for tag in bad}
        outcomes = collect_outcomes(
            kafka_bootstrap,
            t.results,
            t.dead_letters,
            good,
            bad_positions,
            timeout=60,
            keep_docs=True,
            consumer_options=reader,
        )
        assert outcomes.lost(good, bad_positions) == [], worker.log_text()[-3000:]
        assert worker.alive(), worker.log_text()[-3000:]
        _wait_committed(kafka_bootstrap, t)
        return outcomes, positions, t

    yield run
    for worker in workers:
        log = worker.log_text()
        assert worker.terminate() == 0, log[-3000:]
        assert "worker stopped" not in log, log[-3000:]


def _wait_committed(bootstrap: str, t: Topics, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert_committed_to_end(bootstrap, t.group, t.requests)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _dead_letter_records(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every dead letter's (value, Kafka key), as the broker stored it."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "dl-reader", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out = []
        while True:
            batch = consumer.consume(100, 3.0)
            if not batch:
                return out
            out += [(m.value() or b"", m.key()) for m in batch if m.error() is None]
    finally:
        consumer.close()


def test_invalid_json_just_under_and_over_max_record_bytes_dead_letters_that_fit(
    kafka_bootstrap: str, entities: list[str], serve: Callable[..., Any]
) -> None:
    under = _invalid_json(MAX_RECORD_BYTES - 1)  # parsed and refused: 1.2 MB as base64
    over = _invalid_json(MAX_RECORD_BYTES + 1)  # refused unread
    requests = [
        _good("before", entities[0]),
        ("under", b"k-under", under),
        _good("between", entities[1]),
        ("over", b"k-over", over),
        _good("after", entities[2]),
    ]
    outcomes, _, t = serve(requests, {"before", "between", "after"}, {"under", "over"})
    assert set(outcomes.results) == {"before", "between", "after"}
    docs = {d["code"]: d for d in outcomes.dead_letter_docs}
    assert set(docs) == {"invalid_json", "oversized"}
    cut = docs["invalid_json"]
    assert cut["value_truncated"] is True and cut["value_bytes"] == len(under)
    kept = base64.b64decode(cut["value_b64"])
    assert 500_000 < len(kept) < len(under) and under.startswith(kept)
    assert base64.b64decode(cut["key_b64"]) == b"k-under" and not cut["key_truncated"]
    unread = docs["oversized"]
    assert unread["value_b64"] is None and unread["value_truncated"] is True
    schema = validator("dead-letter")
    for doc in docs.values():
        assert_valid(schema, doc)
    for value, key in _dead_letter_records(kafka_bootstrap, t.dead_letters):
        assert len(value) + len(key or b"") <= DEFAULT_MESSAGE_MAX_BYTES


def test_a_result_with_a_500kb_key_becomes_a_dead_letter_and_one_with_300kb_is_served(
    kafka_bootstrap: str, entities: list[str], serve: Callable[..., Any]
) -> None:
    # the result carries the key twice (Kafka key and body): 600 KB fits, 1 MB does not
    requests = [
        _good("big-key", entities[0], key=b"K" * 500_000),
        _good("next", entities[1]),
        _good("fits", entities[2], key=b"F" * 300_000),
    ]
    outcomes, positions, t = serve(requests, {"next", "fits"}, {"big-key"})
    assert set(outcomes.results) == {"next", "fits"}
    (doc,) = outcomes.dead_letter_docs
    assert (doc["stage"], doc["code"], doc["request_id"]) == (
        "publish",
        "result_too_large",
        "big-key",
    )
    assert doc["key_bytes"] == 500_000
    assert (
        f"{doc['source']['topic']}/{doc['source']['partition']}/{doc['source']['offset']}"
        == (positions["big-key"])
    )
    assert_valid(validator("dead-letter"), doc)
    ((value, key),) = _dead_letter_records(kafka_bootstrap, t.dead_letters)
    assert key is None, "a key over a quarter of the room is not the dead letter's key"
    assert len(value) <= DEFAULT_MESSAGE_MAX_BYTES


def _topic_with(bootstrap: str, name: str, partitions: int, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    admin.create_topics([topic])[name].result(30)


def test_results_over_the_result_topics_max_message_bytes_become_dead_letters(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    serve: Callable[..., Any],
) -> None:
    t = fresh_topics(2)
    small = Topics(t.requests, f"{t.results}-small", t.dead_letters, t.group)
    _topic_with(kafka_bootstrap, small.results, 1, **{"max.message.bytes": "600"})
    requests = [_good(f"x{i}", entities[i]) for i in range(50)]
    ids = {tag for tag, _, _ in requests}
    outcomes, _, _ = serve(requests, set(), ids, topics=small)
    assert not outcomes.results
    assert {d["code"] for d in outcomes.dead_letter_docs} == {"result_too_large"}
    assert {d["request_id"] for d in outcomes.dead_letter_docs} == ids


def test_results_that_fit_a_small_topic_limit_are_published(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    serve: Callable[..., Any],
) -> None:
    # ~450-byte results into a topic of 2,000: the producer's batches must stay under it
    t = fresh_topics(2)
    small = Topics(t.requests, f"{t.results}-small", t.dead_letters, t.group)
    _topic_with(kafka_bootstrap, small.results, 1, **{"max.message.bytes": "2000"})
    requests = [_good(f"y{i}", entities[i % len(entities)]) for i in range(300)]
    ids = {tag for tag, _, _ in requests}
    outcomes, _, _ = serve(requests, ids, set(), topics=small)
    assert set(outcomes.results) == ids
    assert not outcomes.dead_letter_docs


def _compact(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    described = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def policy() -> str:
        configs = admin.describe_configs([described])[described].result(30)
        return str(configs["cleanup.policy"].value)

    # the broker applies the change from its metadata log: wait until it says so
    assert eventually(lambda: policy() == "compact", 30), f"{topic}: {policy()}, not compact"


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
@pytest.mark.parametrize("compacted", ["at-start-up", "after-start-up"])
def test_a_keyless_result_for_a_compacted_topic_is_dead_lettered_alone(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    serve: Callable[..., Any],
    delivery: str,
    compacted: str,
    tmp_path: Path,
) -> None:
    # A compacted topic refuses a produce batch holding a record without a key:
    # INVALID_RECORD for that record, librdkafka's _INVALID_DIFFERENT_RECORD for its
    # keyed batch-mates. The worker reads the topic's cleanup.policy at start-up and
    # dead-letters a keyless result before produce, in exactly-once mode inside the
    # transaction, which then commits without an abort. A topic compacted after start-up
    # refuses it: the keyless results become result_refused dead letters, and the keyed
    # ones are sent again (at-least-once) or redone by the next transaction. Either way
    # each keyed request is answered once.
    t = fresh_topics(2)
    topics = Topics(t.requests, f"{t.results}-compacted", t.dead_letters, t.group)
    known = compacted == "at-start-up"
    policy = {"cleanup.policy": "compact"} if known else {}
    _topic_with(kafka_bootstrap, topics.results, 1, **policy)
    requests = [
        _good(f"n{i}", entities[i], key=None if i in (2, 5) else f"k{i}".encode())
        for i in range(12)
    ]
    keyless = {tag for tag, key, _ in requests if key is None}
    keyed = {tag for tag, _, _ in requests} - keyless
    outcomes, positions, _ = serve(
        requests,
        keyed,
        keyless,
        topics=topics,
        started=(lambda: None) if known else (lambda: _compact(kafka_bootstrap, topics.results)),
        top=f'delivery = "{delivery}"',
        reader={"isolation.level": "read_committed"},
    )
    assert dict(outcomes.results) == dict.fromkeys(keyed, 1), outcomes.dead_letter_docs
    assert outcomes.duplicates() == 0
    assert {d["request_id"] for d in outcomes.dead_letter_docs} == keyless
    for doc in outcomes.dead_letter_docs:
        assert doc["code"] == "result_refused", doc
        where = f"{doc['source']['topic']}/{doc['source']['partition']}/{doc['source']['offset']}"
        assert where == positions[doc["request_id"]]
        assert_valid(validator("dead-letter"), doc)
        if known:
            assert f"{topics.results} cannot take the result" in doc["reason"], doc
            assert "compacted topic needs a key" in doc["reason"], doc
    if known:
        log = (tmp_path / "worker.log").read_text()
        assert "refused a record" not in log, "a keyless result reached the broker"
        assert "transaction failed" not in log, "the transaction aborted"
