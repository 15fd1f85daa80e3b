"""Feature stores: what a lookup fetches from Redis, and how its replies parse.

``FeatureStore`` is the plug-in point: ``fetch(entities)`` returns, for each distinct
entity, its feature values, which of them are absent and whether a stored value was
unusable. Two Redis layouts, chosen per lookup (``layout``):

- ``hash``: one hash per entity, one field per feature, fetched with one HMGET per
  entity in a single pipelined round trip. Interoperable with what other tools write;
  every value is parsed from text, which caps it at tens of thousands of rows/s, and a
  value may stay text (string features).
- ``packed``: one string per entity holding the features as little-endian float32 in
  field order, fetched with one MGET per batch and decoded with one ``np.frombuffer``.

``worker.features.lookups`` sends the commands of all of a batch's lookups in one round trip;
``worker.pipeline.feeds`` turns what they fetch into the model's inputs.

Redis errors are sorted by what they mean (``classify_redis_error``), because retrying
the wrong kind stalls the worker forever: a reply about one key (WRONGTYPE) refuses only
that entity's requests (dead letters, code ``feature_store_error``); an outage (no
connection, a timeout, LOADING, BUSY ...) makes the batch wait and retry; a refusal only
an operator can fix (NOPERM, credentials, a cluster node) raises
``FeatureStoreConfigError``, which stops start-up (``probe``) and at run time makes the
batch wait with readiness false.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import redis

from worker.config import FeatureSpec, RedisSettings
from worker.errors import FeatureStoreError
from worker.features.redis_io import (
    Command,
    RedisClient,
    cluster_round_trip,
    ping,
    redis_client,
    round_trip,
    settle,
)

__all__ = [
    "PROBE_ENTITY",
    "FeatureStore",
    "Fetched",
    "RedisHashStore",
    "RedisPackedStore",
    "RedisStore",
    "RowStore",
    "Share",
    "exchange",
    "pack_vector",
]

RawRow = Sequence[bytes | str | None]

PROBE_ENTITY = "streamfer-probe"
"""The entity whose key ``probe`` reads at start-up; a valid entity id, absent in practice."""

Problem = tuple[str, str]
"""(dead-letter code, reason) for an entity whose requests cannot be served."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """Feature values of distinct entities, in the spec's field order."""

    values: npt.NDArray[np.floating[Any]]
    """Numbers, float64 from text (a hash) or float32 (packed); 0 in text columns."""
    absent: npt.NDArray[np.bool_]
    bad: list[Problem | None]
    """Per entity: (code, reason) when its requests must be dead letters, or None: a stored
    value that does not parse (``bad_feature_value``), a key Redis refused to read
    (``feature_store_error``)."""
    text: npt.NDArray[np.object_] | None = None
    """The stored strings of the text columns (None elsewhere), when the store has any."""

    @classmethod
    def from_raw(
        cls,
        raw: list[RawRow],
        fields: Sequence[str],
        refused: dict[int, str] | None = None,
        text_fields: Collection[str] = (),
    ) -> Fetched:
        """Parse raw per-field values (None where absent); ``text_fields`` are kept as
        str. ``refused`` gives, by row, why Redis refused that entity's key (its row is all
        None). Raises FeatureStoreError when the store answered the wrong number of rows
        or values."""
        width = len(fields)
        if any(len(row) != width for row in raw):
            raise FeatureStoreError(f"feature store answered rows without {width} values each")
        text = None
        problems: dict[int, Problem] = {}
        if text_fields:
            raw, text, problems = _split_text(raw, fields, text_fields)
        values, absent, bad = _parse_rows(raw, fields)
        for i, problem in problems.items():
            bad[i] = bad[i] or problem
        for i, reason in (refused or {}).items():
            bad[i] = ("feature_store_error", reason)
        return cls(values, absent, bad, text)


class FeatureStore(Protocol):
    """Fetches the features of many entities in one round trip."""

    def fetch(self, entities: Sequence[str]) -> Fetched:
        """Rows aligned with ``entities``; a problem with one entity is in ``bad``.
        Raises FeatureStoreError (an outage) or FeatureStoreConfigError."""
        ...


class RowStore:
    """Base of stores that answer raw text values per field (``get_many``)."""

    fields: Sequence[str]

    def get_many(self, entities: Sequence[str]) -> list[RawRow]:
        raise NotImplementedError

    def fetch(self, entities: Sequence[str]) -> Fetched:
        return Fetched.from_raw(self.get_many(entities), self.fields)


@dataclass(frozen=True, slots=True)
class Share:
    """One store's part of a batch's Redis round trip: pre-encoded commands, one reply
    each. ``keys[i]`` is the one key ``commands[i]`` names, for routing in a cluster."""

    commands: list[bytes]
    keys: list[bytes]


class RedisStore:
    """What the Redis layouts share: one client, a key template, the round trip.

    A store encodes its commands (``share``) and parses their replies (``parse``), so
    that ``worker.features.lookups`` can send the shares of several stores in one round trip;
    ``fetch`` is that round trip for this store alone.
    """

    def __init__(self, client: RedisClient, spec: FeatureSpec, command: str) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        self.cluster = isinstance(client, redis.RedisCluster)
        self.command = Command.of(command, client, spec)

    def share(self, entities: Sequence[str]) -> Share:
        raise NotImplementedError

    def parse(
        self, entities: Sequence[str], answers: list[Any], errors: dict[int, redis.ResponseError]
    ) -> Fetched:
        raise NotImplementedError

    def fetch(self, entities: Sequence[str]) -> Fetched:
        if not entities:
            return self.parse(entities, [], {})
        share = self.share(entities)
        answers, errors = exchange(self._client, share.commands, share.keys, self.command)
        return self.parse(entities, answers, errors)

    def ping(self) -> None:
        ping(self._client)

    def probe(self) -> None:
        """Start-up check with the command a batch sends, for ``PROBE_ENTITY``'s key, so
        an ACL user not allowed it on the key pattern fails start-up, not the first
        batch. Raises FeatureStoreConfigError (what to fix) or FeatureStoreError."""
        self.fetch([PROBE_ENTITY])

    def close(self) -> None:
        self._client.close()

    def _key(self, entity: str) -> bytes:
        return f"{self._prefix}{entity}{self._suffix}".encode()


def exchange(
    client: RedisClient, commands: list[bytes], keys: list[bytes], command: Command
) -> tuple[list[Any], dict[int, redis.ResponseError]]:
    """One round trip of pre-encoded commands, one reply each: a single write to a
    standalone Redis, one write per node (grouped by ``keys``) to a cluster."""
    if isinstance(client, redis.RedisCluster):
        return cluster_round_trip(client, commands, keys, command)
    return round_trip(client, b"".join(commands), len(commands), command)


class RedisHashStore(RedisStore):
    """Features as Redis hashes: one HMGET per distinct entity, all in one round trip.

    Hashes are the layout other tools write, so existing feature pipelines interoperate,
    and a hash field may hold text (``text_fields``: string features, kept as str).
    The commands are encoded here as RESP (the field list once, not per entity), since
    redis-py's per-command packing costs more than Redis itself at batch sizes in the
    hundreds.
    """

    def __init__(
        self, client: RedisClient, spec: FeatureSpec, text_fields: Collection[str] = ()
    ) -> None:
        super().__init__(client, spec, "HMGET")
        self.text_fields = frozenset(text_fields) & frozenset(spec.fields)
        encoded = [f.encode() for f in spec.fields]
        self._head = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(encoded))
        self._tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in encoded)

    @classmethod
    def connect(
        cls, settings: RedisSettings, spec: FeatureSpec, text_fields: Collection[str] = ()
    ) -> RedisHashStore:
        return cls(redis_client(settings), spec, text_fields)

    def get_many(self, entities: Sequence[str]) -> list[RawRow]:
        """Raw values per entity; one whose key Redis refused reads as absent (``fetch``
        names it)."""
        if not entities:
            return []
        share = self.share(entities)
        answers, errors = exchange(self._client, share.commands, share.keys, self.command)
        return self._rows(entities, answers, errors)[0]

    def share(self, entities: Sequence[str]) -> Share:
        head, tail = self._head, self._tail
        keys = [self._key(entity) for entity in entities]
        return Share([head + b"$%d\r\n%s\r\n" % (len(k), k) + tail for k in keys], keys)

    def parse(
        self, entities: Sequence[str], answers: list[Any], errors: dict[int, redis.ResponseError]
    ) -> Fetched:
        rows, refused = self._rows(entities, answers, errors)
        return Fetched.from_raw(rows, self.fields, refused, self.text_fields)

    def _rows(
        self, entities: Sequence[str], answers: list[Any], errors: dict[int, redis.ResponseError]
    ) -> tuple[list[RawRow], dict[int, str]]:
        """Rows, and why Redis refused an entity's key (by position)."""
        if not errors:
            return answers, {}
        prefix, suffix = self._prefix, self._suffix
        refused = settle(self.command, errors, lambda i: f"{prefix}{entities[i]}{suffix}")
        blank = [None] * len(self.fields)
        for i in refused:
            answers[i] = blank
        return answers, refused


class RedisPackedStore(RedisStore):
    """Features as one little-endian float32 vector per entity: one MGET per batch.

    Parsing costs one ``np.frombuffer`` for the whole batch instead of one float() per
    value, so the fetch runs several times faster than hashes for the same features.
    Against a cluster, which refuses MGET across slots, it is one GET per key.
    """

    def __init__(self, client: RedisClient, spec: FeatureSpec) -> None:
        cluster = isinstance(client, redis.RedisCluster)
        super().__init__(client, spec, "GET" if cluster else "MGET")
        self._row_bytes = 4 * len(spec.fields)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisPackedStore:
        return cls(redis_client(settings), spec)

    def share(self, entities: Sequence[str]) -> Share:
        keys = [self._key(e) for e in entities]
        if self.cluster:
            return Share([b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k) for k in keys], keys)
        parts = [b"*%d\r\n$4\r\nMGET\r\n" % (len(keys) + 1)]
        parts += [b"$%d\r\n%s\r\n" % (len(k), k) for k in keys]
        return Share([b"".join(parts)], [])

    def parse(
        self, entities: Sequence[str], answers: list[Any], errors: dict[int, redis.ResponseError]
    ) -> Fetched:
        m, width, size = len(entities), len(self.fields), self._row_bytes
        if not entities:
            return Fetched(np.zeros((0, width), np.float32), np.zeros((0, width), np.bool_), [])
        bad: list[Problem | None] = [None] * m
        if self.cluster:
            blobs = answers
            if errors:  # a reply per key: one refused key is its entity's problem
                refused = settle(self.command, errors, lambda i: self._key(entities[i]).decode())
                for i, reason in refused.items():
                    bad[i] = ("feature_store_error", reason)
        else:
            (blobs,) = answers
            if errors:
                settle(self.command, errors, None)  # one reply for all keys: names none
        absent = np.zeros((m, width), dtype=np.bool_)
        if all(b is not None and len(b) == size for b in blobs):
            values = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(m, width)
            return Fetched(values.astype(np.float32, copy=False), absent, bad)
        filler = bytes(size)
        joined = []
        for i, blob in enumerate(blobs):
            if blob is None:
                absent[i] = True
                joined.append(filler)
            elif len(blob) != size:
                bad[i] = (
                    "bad_feature_value",
                    f"packed vector has {len(blob)} bytes, expected {size}",
                )
                joined.append(filler)
            else:
                joined.append(blob)
        values = np.frombuffer(b"".join(joined), dtype="<f4").reshape(m, width)
        return Fetched(values.astype(np.float32, copy=False), absent, bad)


def pack_vector(values: Sequence[float] | npt.NDArray[np.floating[Any]]) -> bytes:
    """The ``packed`` layout's value for one entity: float32 little-endian, field order."""
    return np.asarray(values, dtype="<f4").tobytes()


def _parse_rows(
    raw: list[RawRow], fields: Sequence[str]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], list[Problem | None]]:
    """Convert raw values in one numpy call; fall back per entity only to name a bad one."""
    m, width = len(raw), len(fields)
    flat: list[Any] = [v for row in raw for v in row]
    if None in flat:
        absent = np.fromiter((v is None for v in flat), np.bool_, len(flat)).reshape(m, width)
        flat = [b"0" if v is None else v for v in flat]
    else:
        absent = np.zeros((m, width), dtype=np.bool_)
    bad: list[Problem | None] = [None] * m
    try:
        values = np.fromiter(map(float, flat), np.float64, len(flat)).reshape(m, width)
    except (ValueError, TypeError):
        values = np.zeros((m, width), dtype=np.float64)
        for i, row in enumerate(raw):
            for j, v in enumerate(row):
                if v is None:
                    continue
                try:
                    values[i, j] = float(v)
                except ValueError:
                    bad[i] = (
                        "bad_feature_value",
                        f"stored feature {fields[j]!r} is not a number: {v[:32]!r}",
                    )
                    break
    return values, absent, bad


def _split_text(
    raw: list[RawRow], fields: Sequence[str], text_fields: Collection[str]
) -> tuple[list[RawRow], npt.NDArray[np.object_], dict[int, Problem]]:
    """Take the text columns out of ``raw`` (a placeholder number stays where a value
    was, None where none was) into an object array of str, decoding UTF-8."""
    positions = [j for j, name in enumerate(fields) if name in text_fields]
    text = np.full((len(raw), len(fields)), None, dtype=object)
    problems: dict[int, Problem] = {}
    numeric: list[RawRow] = []
    for i, row in enumerate(raw):
        kept = list(row)
        for j in positions:
            v = row[j]
            if v is None:
                continue
            kept[j] = b"0"
            try:
                text[i, j] = v.decode("utf-8") if isinstance(v, bytes) else v
            except UnicodeDecodeError:
                problems[i] = ("bad_feature_value", f"stored feature {fields[j]!r} is not UTF-8")
        numeric.append(kept)
    return numeric, text, problems
