"""Exactly-once support: the transactional producer and a check that the broker isolates.

``delivery = "exactly-once"`` makes every batch one Kafka transaction holding its results,
its dead letters and its consumed offsets (``send_offsets_to_transaction`` with the
consumer's group metadata, so a zombie whose partitions moved on is fenced by the group
generation). Readers with ``isolation.level=read_committed`` then see each request's
outcome exactly once. That promise needs a broker that really hides aborted
transactions, so ``verify_isolation`` proves it at start-up on a probe topic and refuses
to start otherwise (Tansu, for one, accepts transactions but shows aborted records).
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from worker.config import KafkaSettings, WorkerConfig
from worker.errors import ConfigError
from worker.kafka.admin import admin_client
from worker.kafka.call_watch import CallWatch
from worker.kafka.client_logs import KAFKA_LOG
from worker.kafka.limits import RecordLimits
from worker.kafka.sink import producer_config
from worker.kafka.topics import create_missing

__all__ = ["PROBE_TOPIC", "transactional_id", "transactional_producer", "verify_isolation"]

PROBE_TOPIC: str = WorkerConfig.model_fields["exactly_once_probe_topic"].default


def transactional_id(settings: KafkaSettings) -> str:
    """Stable per static member, unique otherwise. With ``group_instance_id`` a restarted
    worker fences its predecessor and aborts the transaction it left open at once;
    without, read_committed readers wait up to ``transaction.timeout.ms`` after a crash."""
    member = (
        settings.group_instance_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    return f"streamfer-{settings.group_id}-{member}"


def transactional_producer(
    settings: KafkaSettings,
    limits: RecordLimits | None = None,
    timeout: float = 30.0,
    calls: CallWatch | None = None,
) -> Producer:
    """A producer with transactions initialised (through ``calls``, so a broker that never
    answers raises ``CallStalled``). Raises ConfigError when the broker refuses."""
    conf: dict[str, Any] = producer_config(settings, limits)
    conf["transactional.id"] = transactional_id(settings)
    # A killed worker's open transaction holds back read_committed readers until the
    # coordinator aborts it; keep that short unless the user chose otherwise.
    conf.setdefault("transaction.timeout.ms", 30_000)
    conf.pop("linger.ms", None)
    producer = Producer(conf)
    watch = calls or CallWatch()
    try:
        watch.run("init_transactions", producer.init_transactions, timeout)
    except KafkaException as exc:
        raise ConfigError(
            f"delivery = 'exactly-once' needs a broker with transactions; init failed: {exc}"
        ) from exc
    return producer


def _ensure_probe_topic(settings: KafkaSettings, topic: str, timeout: float) -> None:
    """The probe topic, created when missing with the cluster's default replication (a
    cluster that wants 3 replicas gets them). A user who may not create topics can still
    probe on one made for it: existence is asked first, since a refused creation would
    also refuse an existing topic."""
    admin = admin_client(settings)
    try:
        found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise ConfigError(f"cannot read the metadata of {topic!r}: {exc}") from exc
    if found is not None and found.error is None:
        return
    try:
        new = NewTopic(topic, num_partitions=1, replication_factor=-1)
        create_missing(admin, [new], timeout=timeout, error=ConfigError)
    except ConfigError as exc:
        raise ConfigError(
            f"delivery = 'exactly-once' proves read_committed isolation at start-up on the "
            f"topic {topic!r}, which is missing and could not be created ({exc}); create it "
            "(one partition) and let "
            "this user write and read it, name another with exactly_once_probe_topic, or set "
            "exactly_once_probe = false to start without the proof"
        ) from None


def verify_isolation(
    settings: KafkaSettings,
    timeout: float = 30.0,
    *,
    topic: str = PROBE_TOPIC,
    calls: CallWatch | None = None,
) -> None:
    """Abort one record and commit another on the probe topic; a read_committed reader must
    see only the committed one. Raises ConfigError otherwise, ``CallStalled`` when a
    transactional call (made through ``calls``) outlives its timeout."""
    _ensure_probe_topic(settings, topic, timeout)
    probe = settings.model_copy(update={"group_instance_id": None})
    watch = calls or CallWatch()
    producer = transactional_producer(probe, timeout=timeout, calls=watch)
    marker = uuid.uuid4().hex.encode()
    try:
        producer.begin_transaction()
        producer.produce(topic, b"aborted-" + marker, partition=0)
        producer.flush(timeout)
        watch.run("abort_transaction", producer.abort_transaction, timeout)
        producer.begin_transaction()
        producer.produce(topic, b"committed-" + marker, partition=0)
        watch.run("commit_transaction", producer.commit_transaction, timeout)
    except KafkaException as exc:
        raise ConfigError(
            f"delivery = 'exactly-once': transactions do not work here: {exc}"
        ) from exc
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"streamfer-probe-{marker.decode()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "logger": KAFKA_LOG,
            **settings.client_options(),
            **settings.consumer_options,
        }
    )
    seen: list[bytes] = []
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        consumer.assign([TopicPartition(topic, 0, max(low, high - 50))])
        for _ in range(int(timeout * 5)):
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None and (msg.value() or b"").endswith(marker):
                    seen.append(msg.value() or b"")
            if any(v.startswith(b"committed-") for v in seen):
                break
    finally:
        consumer.close()
    if any(v.startswith(b"aborted-") for v in seen):
        raise ConfigError(
            "delivery = 'exactly-once' refused: this broker shows aborted transactional "
            "records to read_committed consumers, so results could be seen twice"
        )
    if not seen:
        raise ConfigError("delivery = 'exactly-once': the committed probe record never arrived")
