"""How long after each fault a consumer group served every partition again, read after
the run.

A thread samples the group's committed offsets and the request topic's log ends every
half second, with a consumer of its own that never joins the group, so faults that come
close together are never held back by the measuring. ``after(t)`` then finds the first
sample at which every partition had committed past where it stood at ``t``, or had
caught up with its log end (``netfaults.served``): the seconds from a kill, a restart or
a scale step until the group was whole again.

A sample is stamped when its reads are done, and a read waits on the brokers it asks: a
partition's log end on its leader, the committed offsets on the group's coordinator.
While a fault leaves the sampler's own client waiting, the figure includes that wait;
``sampling(t)`` says how long the longest gap between samples was until the group was
served again, and how long the read that showed it took, so the two can be told apart.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from benchmarks import netfaults

__all__ = ["END_WAIT_S", "OffsetHistory", "answered_after", "read_ends", "request_times"]

_FRESH_AFTER = 6
"""Failed samples in a row after which the sampler's client is replaced."""

END_WAIT_S = 1.0
"""How long a sample waits for one partition's log end. A partition whose leader is gone
keeps its last end known instead of holding the whole sample for the committed offsets
(its end only says whether it is caught up); the sampler's client looks for new leaders
every ``METADATA_EVERY_MS``, not every five minutes as a client that fetches nothing."""

METADATA_EVERY_MS = 1000

Sample = tuple[float, dict[int, int], dict[int, int]]
"""(wall-clock seconds, committed offset per partition, log end per partition)."""


class OffsetHistory:
    """Committed offsets and log ends of ``group`` on ``topic`` over time."""

    def __init__(
        self, bootstrap: str, group: str, topic: str, partitions: int, every_s: float = 0.5
    ) -> None:
        self._conf = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "topic.metadata.refresh.interval.ms": METADATA_EVERY_MS,
        }
        self._consumer = Consumer(self._conf)
        self._parts = [TopicPartition(topic, p) for p in range(partitions)]
        self._every_s = every_s
        self._samples: list[Sample] = []
        self._ends: dict[int, int] = {}
        """Each partition's last log end read."""
        self._read_s: dict[float, float] = {}
        """How long each sample's reads took, by the sample's time."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="served-again", daemon=True)

    def start(self) -> OffsetHistory:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        parts = self._parts
        failures = 0
        while not self._stop.wait(self._every_s):
            consumer = self._consumer
            began = time.time()
            try:
                committed = {tp.partition: tp.offset for tp in consumer.committed(parts, 5)}
                ends = read_ends(consumer, parts, self._ends)
            except KafkaException:  # a coordinator moving, say: the next sample
                failures += 1
                if failures >= _FRESH_AFTER:
                    # a client that lost every broker at once can keep failing after they
                    # are back (seen with two of three brokers killed): start a new one
                    failures = 0
                    self._consumer = Consumer(self._conf)
                    consumer.close()
                continue
            failures = 0
            now = time.time()
            self._samples.append((now, committed, ends))
            self._read_s[now] = now - began

    def after(self, fault_s: float) -> float | None:
        """Seconds from ``fault_s`` (wall clock) until every partition was served again;
        None if that never happened while sampling."""
        later = [s for s in self._samples if s[0] >= fault_s]
        if not later:
            return None
        served = self._served_sample(later)
        return None if served is None else round(later[served][0] - fault_s, 1)

    def caught_up_after(self, fault_s: float) -> float | None:
        """Seconds from ``fault_s`` until every partition had committed up to its log end
        at the fault: everything written before it answered. Unlike ``after``, records a
        worker fetched before the fault and works through meanwhile cannot make it look
        served; None if that never happened while sampling."""
        later = [s for s in self._samples if s[0] >= fault_s]
        if not later:
            return None
        _, _, ends = later[0]
        for at, committed, _ in later:
            if all(committed.get(p, -1) >= end for p, end in ends.items()):
                return round(at - fault_s, 1)
        return None

    def sampling(self, fault_s: float) -> dict[str, float] | None:
        """How the sampler fared from ``fault_s`` until the group was served again: the
        longest gap between two samples (from the fault on) and how long the read that
        showed it served took; None if it never was."""
        later = [s for s in self._samples if s[0] >= fault_s]
        served = self._served_sample(later)
        if served is None:
            return None
        times = [fault_s, *(s[0] for s in later[: served + 1])]
        return {
            "longest_gap_s": round(max(b - a for a, b in itertools.pairwise(times)), 1),
            "read_s": round(self._read_s.get(later[served][0], 0.0), 1),
        }

    @staticmethod
    def _served_sample(later: Sequence[Sample]) -> int | None:
        if not later:
            return None
        _, baseline, _ = later[0]
        for i, (_, committed, ends) in enumerate(later[1:], start=1):
            if netfaults.served(baseline, committed, ends):
                return i
        return None


class Watermarks(Protocol):
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...


def read_ends(
    consumer: Watermarks, parts: Sequence[TopicPartition], known: dict[int, int]
) -> dict[int, int]:
    """Each partition's log end, waiting ``END_WAIT_S`` at most for one; a partition whose
    leader does not answer keeps its end in ``known`` (updated with what was read).
    Raises ``KafkaException`` if such a partition has none known yet."""
    for tp in parts:
        try:
            known[tp.partition] = consumer.get_watermark_offsets(tp, END_WAIT_S)[1]
        except KafkaException:
            if tp.partition not in known:
                raise
    return {tp.partition: known[tp.partition] for tp in parts}


def request_times(bootstrap: str, topic: str, timeout: float = 60.0) -> dict[str, int]:
    """When each request of ``topic`` was written (its timestamp, milliseconds), by
    ``partition/offset``, the name a result gives its source."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "served-again-reader"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            for p in meta.partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        times: dict[str, int] = {}
        left = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(2000, 0.5):
                if msg.error() is None:
                    p, offset = msg.partition() or 0, msg.offset() or 0
                    times[f"{p}/{offset}"] = msg.timestamp()[1]
                    if offset + 1 >= ends[p]:
                        left.discard(p)
        return times
    finally:
        consumer.close()


def answered_after(
    fault_ms: int, written: Mapping[str, int], answered: Mapping[str, Sequence[int]]
) -> float | None:
    """Seconds from a fault until every request written before it had its first answer:
    how a share group, which commits nothing to sample, is served again. None if one
    never was answered."""
    firsts = [min(answered.get(s) or [-1]) for s, ts in written.items() if ts <= fault_ms]
    if any(first < 0 for first in firsts):
        return None
    return round(max(0, max(firsts, default=fault_ms) - fault_ms) / 1000, 1)
