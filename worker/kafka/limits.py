"""How large a record each output topic accepts, and whether it needs a key, so nothing
is produced that the broker would refuse.

Two limits apply to a produced record: the producer's ``message.max.bytes`` (librdkafka
refuses a larger record before sending it) and the topic's ``max.message.bytes`` (the
broker refuses a larger record batch). ``RecordLimits`` holds the smaller of the two per
topic, read once at start-up, less ``RECORD_OVERHEAD`` for the batch and record framing.
The producer's ``batch.size`` is capped at the smallest topic limit too, so records that
fit one by one never make a batch the broker refuses.

A compacted topic (``cleanup.policy`` holding ``compact``) refuses a record without a
key, and the broker refuses the whole produce batch it came in (INVALID_RECORD on every
record of it): the keyed records sharing that batch would be refused too. So the same
read notes the compacted topics, and a keyless record bound for one is refused before
it is produced (``RecordLimits.compacted``).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

from worker.config import KafkaSettings
from worker.kafka.admin import admin_client

__all__ = [
    "DEFAULT_MESSAGE_MAX_BYTES",
    "NEEDS_A_KEY",
    "RECORD_OVERHEAD",
    "RecordLimits",
    "cap_batch_size",
    "headers_size",
    "record_size",
]

log = logging.getLogger(__name__)

DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""

NEEDS_A_KEY = "compacted topic needs a key"
"""Why a keyless record for a compacted topic is refused (the broker's words, in short)."""

RECORD_OVERHEAD = 512
"""Bytes a record costs beyond its key, value and headers: the record batch header (61
bytes), the record's varint framing and each header's, rounded up generously."""


def headers_size(headers: Iterable[tuple[str, str | bytes | None]] | None) -> int:
    """Bytes of ``headers``' names and values (framing is in ``RECORD_OVERHEAD``)."""
    if not headers:
        return 0
    return sum(len(name) + (len(value) if value else 0) for name, value in headers)


def record_size(
    value: bytes | None,
    key: bytes | None,
    headers: Iterable[tuple[str, str | bytes | None]] | None,
) -> int:
    """What a record weighs against a limit of ``RecordLimits``."""
    return (len(value) if value else 0) + (len(key) if key else 0) + headers_size(headers)


class RecordLimits:
    """The largest record (value, key and headers) each topic takes from this producer,
    and the topics that take only records with a key."""

    def __init__(
        self,
        message_max_bytes: int,
        topic_max_bytes: Mapping[str, int],
        compacted: Iterable[str] = (),
    ) -> None:
        self.message_max_bytes = message_max_bytes
        self.compacted = frozenset(compacted)
        """Topics whose ``cleanup.policy`` compacts: a keyless record is refused there."""
        self._by_topic = {
            topic: min(message_max_bytes, limit) - RECORD_OVERHEAD
            for topic, limit in topic_max_bytes.items()
        }
        self._default = message_max_bytes - RECORD_OVERHEAD

    @classmethod
    def unread(cls) -> RecordLimits:
        """librdkafka's default limit for every topic (no cluster to ask)."""
        return cls(DEFAULT_MESSAGE_MAX_BYTES, {})

    def __call__(self, topic: str) -> int:
        return self._by_topic.get(topic, self._default)

    def needs_key(self, topic: str) -> bool:
        """Whether ``topic`` refuses a record without a key (ask once per batch)."""
        return topic in self.compacted

    def smallest(self) -> int:
        return min([self._default, *self._by_topic.values()])

    @classmethod
    def read(cls, settings: KafkaSettings, topics: Iterable[str]) -> RecordLimits:
        """Read each topic's ``max.message.bytes`` and ``cleanup.policy`` from the cluster;
        a topic whose config cannot be read (no DescribeConfigs permission, say) keeps only
        the producer's limit and counts as not compacted (a keyless record is then sent,
        and the broker's refusal dead-letters it), with a warning."""
        producer_side = {**settings.client_options(), **settings.producer_options}
        message_max = int(producer_side.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
        found: dict[str, int] = {}
        compacted: set[str] = set()
        admin = admin_client(settings)
        wanted = [ConfigResource("TOPIC", t) for t in dict.fromkeys(topics)]
        try:
            futures = admin.describe_configs(wanted, request_timeout=10)
        except KafkaException as exc:
            log.warning(
                "cannot read topic configs (%s); using message.max.bytes only, and keyless "
                "records are not held back from compacted topics",
                exc,
            )
            return cls(message_max, found)
        for resource, future in futures.items():
            try:
                entries = future.result(15)
            except (KafkaException, concurrent.futures.TimeoutError) as exc:
                log.warning(
                    "cannot read the config of topic %s (%s); records to it are held to the "
                    "producer's message.max.bytes (%d), and sent even without a key",
                    resource.name,
                    exc,
                    message_max,
                )
                continue
            entry = entries.get("max.message.bytes")
            if entry is not None and entry.value is not None:
                found[resource.name] = int(entry.value)
            if _compacts(entries.get("cleanup.policy")):
                compacted.add(resource.name)
        return cls(message_max, found, compacted)


def _compacts(entry: Any) -> bool:
    """Whether a ``cleanup.policy`` config entry (``compact``, ``compact,delete``) compacts."""
    value = getattr(entry, "value", None)
    return isinstance(value, str) and "compact" in (p.strip() for p in value.split(","))


def cap_batch_size(producer_conf: dict[str, Any], limits: RecordLimits) -> None:
    """Keep the producer's batches under the smallest topic limit: librdkafka fills a
    batch up to ``batch.size`` (default 1,000,000), and a topic that takes less refuses
    the whole batch."""
    smallest = limits.smallest()
    current = int(producer_conf.get("batch.size", DEFAULT_MESSAGE_MAX_BYTES))
    if smallest < current:
        producer_conf["batch.size"] = max(1, smallest)
