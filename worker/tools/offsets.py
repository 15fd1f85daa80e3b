"""Where a consumer group stands, and moving a stopped group: ``streamfer offsets``.

``show`` lists, per partition of a config's request topics, the group's committed offset,
the log end, the lag in records and the lag in seconds (now minus the Kafka timestamp of
the first record not yet committed). ``reset`` moves a group's committed offsets to the
earliest or latest offset, or to the first record at or after a time; it refuses while
the group has members, because a running member would overwrite the new offsets with its
next commit. It is also where ``replay`` finds its bounds: ``KafkaOffsets`` answers
partitions, watermarks, offsets for times and committed offsets. Everything goes through
a ``Consumer`` that never subscribes (so it never joins the group it inspects) and, for
group state, ``AdminClient.describe_consumer_groups``; ``AdminClient``'s offset-fetch call
is avoided on purpose: librdkafka 2.16 crashes in it when the group coordinator is not
ready yet (confluent-kafka-python issue 1982).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import orjson
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from worker.config import KafkaSettings, WorkerConfig
from worker.core import Deadline, PartitionKey
from worker.errors import CommitError, ConfigError, SourceError
from worker.kafka import COORDINATOR_WAIT_S, KAFKA_LOG, admin_client, coordinator_settling
from worker.tools.ranges import Bounds, OffsetLookup, resolve_ranges

__all__ = [
    "KafkaOffsets",
    "PartitionLag",
    "ResetTarget",
    "group_lag",
    "group_members",
    "lookup_consumer_config",
    "parse_partitions",
    "parse_time",
    "plan_reset",
    "reset_command",
    "show_command",
]

log = logging.getLogger(__name__)


def parse_time(text: str) -> int:
    """Epoch milliseconds from ``1767225600000`` or ISO-8601 (``2026-01-01T00:00:00Z``).

    A time without a zone is read as UTC. Raises ``ConfigError`` naming the text.
    """
    value = text.strip()
    if value.isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"not a time: {text!r} (use ISO-8601 like 2026-01-01T12:00:00Z, or epoch ms)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_partitions(text: str) -> list[int]:
    """``"0,2,5-7"`` → ``[0, 2, 5, 6, 7]``. Raises ``ConfigError``."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if sep else first
        except ValueError:
            raise ConfigError(f"not a partition list: {text!r} (use 0,2,5-7)") from None
        if first < 0 or last < first:
            raise ConfigError(f"not a partition range: {part!r}")
        out.update(range(first, last + 1))
    if not out:
        raise ConfigError(f"no partitions in {text!r}")
    return sorted(out)


def lookup_consumer_config(settings: KafkaSettings, group_id: str) -> dict[str, Any]:
    """A consumer that only assigns: it never joins ``group_id``, only reads and commits
    its offsets. User options (security) apply; group-membership options do not matter."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers, "logger": KAFKA_LOG}
    conf.update(settings.client_options())
    conf.update(settings.consumer_options)
    conf.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",  # records gone to retention: go on, never skip
        }
    )
    conf.pop("group.instance.id", None)
    return conf


class KafkaOffsets:
    """``ranges.OffsetLookup`` and committed-offset access over one assign-only ``Consumer``.

    Every call blocks for at most ``timeout`` seconds per request and raises
    ``SourceError`` when the cluster does not answer.
    """

    def __init__(self, consumer: Consumer, *, timeout: float = 10.0) -> None:
        self.consumer = consumer
        self._timeout = timeout

    @classmethod
    def connect(cls, settings: KafkaSettings, group_id: str) -> KafkaOffsets:
        return cls(Consumer(lookup_consumer_config(settings, group_id)))

    def partitions(self, topic: str) -> list[int]:
        try:
            meta = self.consumer.list_topics(topic, timeout=self._timeout).topics.get(topic)
        except KafkaException as exc:
            raise SourceError(f"cannot read metadata of topic {topic!r}: {exc}") from exc
        if meta is None or meta.error is not None or not meta.partitions:
            raise ConfigError(f"topic {topic!r} does not exist")
        return sorted(meta.partitions)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        try:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self._timeout, cached=False
            )
        except KafkaException as exc:
            raise SourceError(f"cannot read offsets of {topic}[{partition}]: {exc}") from exc
        return int(low), int(high)

    def offsets_for_time(
        self, topic: str, partitions: Sequence[int], time_ms: int
    ) -> dict[int, int | None]:
        query = [TopicPartition(topic, p, time_ms) for p in partitions]
        try:
            found = self.consumer.offsets_for_times(query, timeout=self._timeout)
        except KafkaException as exc:
            raise SourceError(f"cannot look up offsets of {topic!r} by time: {exc}") from exc
        out: dict[int, int | None] = {}
        for tp in found:
            if tp.error is not None:
                raise SourceError(f"offset for time of {topic}[{tp.partition}]: {tp.error}")
            out[tp.partition] = tp.offset if tp.offset >= 0 else None
        return out

    def committed(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, int | None]:
        """The group's committed offsets (None where it has none)."""
        query = [TopicPartition(t, p) for t, p in keys]
        if not query:
            return {}
        deadline = Deadline.after(COORDINATOR_WAIT_S)
        while True:
            try:
                found = self.consumer.committed(query, timeout=self._timeout)
                break
            except KafkaException as exc:
                if not coordinator_settling(exc) or deadline.passed():
                    raise SourceError(f"cannot read committed offsets: {exc}") from exc
                log.info("the group coordinator is not ready (%s); asking again", exc)
                time.sleep(0.5)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}

    def commit(self, offsets: dict[PartitionKey, int]) -> None:
        """Commit ``offsets`` synchronously for the consumer's group. Raises ``CommitError``."""
        if not offsets:
            return
        parts = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
        try:
            result = self.consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            raise CommitError(f"commit of {len(parts)} partitions failed: {exc}") from exc
        failed = [tp for tp in result or [] if tp.error is not None]
        if failed:
            raise CommitError(
                f"commit refused for {failed[0].topic}[{failed[0].partition}]: {failed[0].error}"
            )

    def first_timestamps(
        self, positions: dict[PartitionKey, int], timeout: float = 5.0
    ) -> dict[PartitionKey, int]:
        """Kafka timestamp (ms) of the record at each position, where one could be read."""
        if not positions:
            return {}
        consumer = self.consumer
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
        found: dict[PartitionKey, int] = {}
        deadline = Deadline.after(timeout)
        try:
            while len(found) < len(positions) and not deadline.passed():
                for msg in consumer.consume(len(positions), 0.2):
                    if msg.error() is not None:
                        continue
                    key = (str(msg.topic()), int(msg.partition() or 0))
                    if key in positions and key not in found:
                        found[key] = msg.timestamp()[1]
                        consumer.pause([TopicPartition(*key)])
        finally:
            consumer.unassign()
        return found

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing must not hide the real error
            self.consumer.close()


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group: where it is and how far behind."""

    topic: str
    partition: int
    committed: int | None
    log_start: int
    log_end: int
    lag: int | None
    """Records from where the group would resume to the log end (None: it cannot say)."""
    lag_s: float | None
    """Now minus the timestamp of the first record not committed (0 when caught up)."""


def group_lag(
    offsets: KafkaOffsets,
    topics: Sequence[str],
    *,
    auto_offset_reset: str = "earliest",
    now_ms: int | None = None,
) -> list[PartitionLag]:
    """Committed offset, log end and lag of every partition of ``topics``."""
    keys = [(t, p) for t in topics for p in offsets.partitions(t)]
    committed = offsets.committed(keys)
    marks = {k: offsets.watermarks(*k) for k in keys}
    resume: dict[PartitionKey, int | None] = {}
    for k in keys:
        low, high = marks[k]
        c = committed.get(k)
        if c is not None:
            resume[k] = min(max(c, low), high)
        elif auto_offset_reset == "earliest":
            resume[k] = low
        elif auto_offset_reset == "latest":
            resume[k] = high
        else:
            resume[k] = None
    behind = {k: pos for k, pos in resume.items() if pos is not None and pos < marks[k][1]}
    stamps = offsets.first_timestamps(behind)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for k in keys:
        low, high = marks[k]
        pos = resume[k]
        lag = None if pos is None else high - pos
        if lag == 0:
            lag_s: float | None = 0.0
        else:
            stamp = stamps.get(k)
            lag_s = None if stamp is None else round(max(0.0, (now - stamp) / 1000.0), 3)
        out.append(PartitionLag(k[0], k[1], committed.get(k), low, high, lag, lag_s))
    return out


def group_members(settings: KafkaSettings, group_id: str, *, attempts: int = 10) -> tuple[str, int]:
    """(state, member count) of a group; retried while the coordinator is loading.

    Raises ``SourceError`` when the cluster cannot say: callers then must not assume the
    group is stopped.
    """
    admin = admin_client(settings, logger=log)
    error: Exception | None = None
    for attempt in range(attempts):
        try:
            desc = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id].result(
                15
            )
        except KafkaException as exc:
            error = exc
            err = exc.args[0] if exc.args else None
            if (
                isinstance(err, KafkaError)
                and not err.retriable()
                and err.code()
                not in (
                    KafkaError.NOT_COORDINATOR,
                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE,
                )
            ):
                break
            time.sleep(min(2.0, 0.2 * (attempt + 1)))
            continue
        state = desc.state
        name = state.name if isinstance(state, ConsumerGroupState) else str(state)
        return name.lower(), len(desc.members or [])
    raise SourceError(f"cannot describe group {group_id!r}: {error}")


ResetKind = Literal["earliest", "latest", "time"]


@dataclass(frozen=True, slots=True)
class ResetTarget:
    """Where ``offsets reset`` moves a group: earliest, latest, or the first record at or
    after ``time_ms``."""

    kind: ResetKind
    time_ms: int | None = None

    def describe(self) -> str:
        if self.kind == "time" and self.time_ms is not None:
            stamp = datetime.fromtimestamp(self.time_ms / 1000, UTC).isoformat()
            return f"time {stamp.replace('+00:00', 'Z')}"
        return self.kind


def plan_reset(
    lookup: OffsetLookup,
    topics: Sequence[str],
    target: ResetTarget,
    partitions: Sequence[int] | None = None,
) -> dict[PartitionKey, int]:
    """The new offset of every partition of ``topics`` (or just ``partitions``): where a
    range of the whole log, or of the log from ``target``'s time on, starts, or for
    ``latest`` where it ends (``worker.tools.ranges.resolve_ranges``).

    A time after the newest record moves a partition to its log end, like Kafka's own
    ``kafka-consumer-groups.sh --reset-offsets --to-datetime``.
    """
    bounds = Bounds(
        from_time_ms=target.time_ms if target.kind == "time" else None,
        partitions=None if partitions is None else tuple(partitions),
    )
    return {
        r.key: r.end if target.kind == "latest" else r.start
        for r in resolve_ranges(lookup, topics, bounds)
    }


def _topics_of(config: WorkerConfig, pipeline: str | None) -> list[str]:
    if pipeline is None:
        return [t for p in config.pipelines for t in p.request_topics]
    return list(config.pipeline(pipeline).request_topics)


def _say_share_group(config: WorkerConfig, group_id: str, out: TextIO) -> None:
    """Offsets are a consumer group's: where the config names a share group, say that
    its progress is the broker's share-partition state, which these commands neither
    show nor move."""
    if config.kafka.share_group and group_id == config.kafka.group_id:
        out.write(
            f"note: [kafka] share_group = true: {group_id!r} here is a consumer group's "
            "committed offsets; the share group's progress is the broker's share-partition "
            f"state (kafka-share-groups.sh --describe --group {group_id} shows it, "
            "--reset-offsets moves it), which streamfer offsets neither shows nor moves\n"
        )


def _fmt(value: object) -> str:
    return "-" if value is None else str(value)


def show_command(
    config: WorkerConfig,
    *,
    group: str | None = None,
    pipeline: str | None = None,
    as_json: bool = False,
    out: TextIO,
) -> int:
    """Print the lag table (or JSON) of the config's group or ``group``. Returns 0."""
    group_id = group or config.kafka.group_id
    _say_share_group(config, group_id, out if not as_json else sys.stderr)
    topics = _topics_of(config, pipeline)
    offsets = KafkaOffsets.connect(config.kafka, group_id)
    try:
        rows = group_lag(offsets, topics, auto_offset_reset=config.kafka.auto_offset_reset)
    finally:
        offsets.close()
    state, members = group_members(config.kafka, group_id)
    total = sum(r.lag or 0 for r in rows)
    if as_json:
        doc = {
            "group": group_id,
            "state": state,
            "members": members,
            "lag": total,
            "partitions": [asdict(r) for r in rows],
        }
        out.write(orjson.dumps(doc).decode() + "\n")
        return 0
    out.write(f"group {group_id}: {state}, {members} members, lag {total} records\n")
    header = ("topic", "partition", "committed", "log_end", "lag", "lag_s")
    table = [header] + [
        (r.topic, str(r.partition), _fmt(r.committed), str(r.log_end), _fmt(r.lag), _fmt(r.lag_s))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")
    return 0


def reset_command(
    config: WorkerConfig,
    target: ResetTarget,
    *,
    group: str | None = None,
    pipeline: str | None = None,
    partitions: Sequence[int] | None = None,
    yes: bool = False,
    out: TextIO,
    ask: Callable[[str], str] = input,
) -> int:
    """Move a stopped group's offsets to ``target``, after a confirmation unless ``yes``.

    Returns 0 when moved, 1 when refused (active members, or not confirmed). Raises
    ``CommitError`` when the broker refuses the commit (a member joined meanwhile).
    """
    group_id = group or config.kafka.group_id
    _say_share_group(config, group_id, out)
    topics = _topics_of(config, pipeline)
    state, members = group_members(config.kafka, group_id)
    if members or state not in ("empty", "dead"):
        out.write(
            f"refusing: group {group_id!r} is {state} with {members} active members; "
            "stop its workers first (a running member would commit over the reset)\n"
        )
        return 1
    offsets = KafkaOffsets.connect(config.kafka, group_id)
    try:
        plan = plan_reset(offsets, topics, target, partitions)
        before = offsets.committed(plan)
        out.write(f"reset group {group_id} to {target.describe()}:\n")
        for (topic, p), new in sorted(plan.items()):
            out.write(f"  {topic}[{p}]  {_fmt(before.get((topic, p)))} -> {new}\n")
        if not yes:
            try:
                answer = ask("move these offsets? [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                out.write("not confirmed; nothing changed\n")
                return 1
        offsets.commit(plan)
    finally:
        offsets.close()
    out.write(f"moved {len(plan)} partitions\n")
    return 0
