"""Feature enrichment: one Redis round trip per batch, assembled into float32.

``FeatureStore`` is the plug-in point: ``fetch(entities)`` returns, for each distinct
entity, its feature values, which of them are absent and whether a stored value was
unusable. Two Redis layouts, chosen per pipeline (``features.layout``):

- ``hash``: one hash per entity, one field per feature, fetched with one HMGET per
  entity in a single pipelined round trip. Interoperable with what other tools write;
  every value is parsed from text, which caps it at tens of thousands of rows/s.
- ``packed``: one string per entity holding the features as little-endian float32 in
  field order, fetched with one MGET per batch and decoded with one ``np.frombuffer``.

``assemble`` combines those with features a request carried inline into one
preallocated matrix, applying the spec's policy for a missing entity or field; rows it
cannot fill are returned as rejections rather than raised.

Redis errors are sorted by what they mean (``classify_redis_error``), because retrying
the wrong kind stalls the worker forever: a reply about one key (WRONGTYPE) refuses only
that entity's requests (dead letters, code ``feature_store_error``); an outage (no
connection, a timeout, LOADING, BUSY ...) makes the batch wait and retry; a refusal only
an operator can fix (NOPERM, credentials, a cluster node) raises
``FeatureStoreConfigError``, which stops start-up (``probe``) and at run time makes the
batch wait with readiness false.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import redis

from worker.config import FeatureSpec, RedisSettings
from worker.errors import FeatureStoreError
from worker.redis_io import (
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
    "STORES",
    "Assembled",
    "FeatureStore",
    "Fetched",
    "RedisHashStore",
    "RedisPackedStore",
    "RowStore",
    "assemble",
    "connect_store",
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

    values: npt.NDArray[np.float32]
    absent: npt.NDArray[np.bool_]
    bad: list[Problem | None]
    """Per entity: (code, reason) when its requests must be dead letters, or None: a stored
    value that does not parse (``bad_feature_value``), a key Redis refused to read
    (``feature_store_error``)."""

    @classmethod
    def from_raw(
        cls, raw: list[RawRow], width: int, refused: dict[int, str] | None = None
    ) -> Fetched:
        """Parse raw per-field values (None where absent); ``refused`` gives, by row, why
        Redis refused that entity's key (its row is all None). Raises FeatureStoreError
        when the store answered the wrong number of rows or values."""
        if any(len(row) != width for row in raw):
            raise FeatureStoreError(f"feature store answered rows without {width} values each")
        values, absent, bad = _parse_rows(raw, width)
        for i, reason in (refused or {}).items():
            bad[i] = ("feature_store_error", reason)
        return cls(values, absent, bad)


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
        return Fetched.from_raw(self.get_many(entities), len(self.fields))


class RedisHashStore(RowStore):
    """Features as Redis hashes: one HMGET per distinct entity, all in one round trip.

    Hashes are the layout other tools write, so existing feature pipelines interoperate.
    The pipelined commands are encoded here as one RESP buffer (the field list is encoded
    once, not per entity), since redis-py's per-command packing costs more than Redis
    itself at batch sizes in the hundreds.
    """

    def __init__(self, client: RedisClient, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        encoded = [f.encode() for f in spec.fields]
        self._head = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(encoded))
        self._tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in encoded)
        self._command = Command.of("HMGET", client, spec)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisHashStore:
        return cls(redis_client(settings), spec)

    def ping(self) -> None:
        ping(self._client)

    def probe(self) -> None:
        """Start-up check with the command a batch sends: HMGET of ``PROBE_ENTITY``'s key,
        so an ACL user not allowed HMGET on the key pattern fails start-up, not the first
        batch. Raises FeatureStoreConfigError (what to fix) or FeatureStoreError."""
        self.fetch([PROBE_ENTITY])

    def get_many(self, entities: Sequence[str]) -> list[RawRow]:
        """Raw values per entity; one whose key Redis refused reads as absent (``fetch``
        names it)."""
        return self._hmget(entities)[0]

    def fetch(self, entities: Sequence[str]) -> Fetched:
        rows, refused = self._hmget(entities)
        return Fetched.from_raw(rows, len(self.fields), refused)

    def _hmget(self, entities: Sequence[str]) -> tuple[list[RawRow], dict[int, str]]:
        """Rows, and why Redis refused an entity's key (by position)."""
        if not entities:
            return [], {}
        prefix, suffix, head, tail = self._prefix, self._suffix, self._head, self._tail
        client = self._client
        rows: list[RawRow]
        if isinstance(client, redis.RedisCluster):
            keys = [f"{prefix}{entity}{suffix}".encode() for entity in entities]
            commands = [head + b"$%d\r\n%s\r\n" % (len(k), k) + tail for k in keys]
            rows, errors = cluster_round_trip(client, commands, keys, self._command)
        else:
            parts: list[bytes] = []
            append = parts.append
            for entity in entities:
                key = f"{prefix}{entity}{suffix}".encode()
                append(head)
                append(b"$%d\r\n%s\r\n" % (len(key), key))
                append(tail)
            rows, errors = round_trip(client, b"".join(parts), len(entities), self._command)
        if not errors:
            return rows, {}
        refused = settle(self._command, errors, lambda i: f"{prefix}{entities[i]}{suffix}")
        blank = [None] * len(self.fields)
        for i in refused:
            rows[i] = blank
        return rows, refused

    def close(self) -> None:
        self._client.close()


class RedisPackedStore:
    """Features as one little-endian float32 vector per entity: one MGET per batch.

    Parsing costs one ``np.frombuffer`` for the whole batch instead of one float() per
    value, so the fetch runs several times faster than hashes for the same features.
    """

    def __init__(self, client: RedisClient, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        self._row_bytes = 4 * len(spec.fields)
        # a cluster refuses MGET across slots: one GET per key, grouped by node
        cluster = isinstance(client, redis.RedisCluster)
        self._command = Command.of("GET" if cluster else "MGET", client, spec)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisPackedStore:
        return cls(redis_client(settings), spec)

    def ping(self) -> None:
        ping(self._client)

    def probe(self) -> None:
        """Start-up check with the command a batch sends: MGET of ``PROBE_ENTITY``'s key,
        so an ACL user not allowed MGET on the key pattern fails start-up, not the first
        batch. Raises FeatureStoreConfigError (what to fix) or FeatureStoreError."""
        self.fetch([PROBE_ENTITY])

    def fetch(self, entities: Sequence[str]) -> Fetched:
        m, width, size = len(entities), len(self.fields), self._row_bytes
        if not entities:
            return Fetched(np.zeros((0, width), np.float32), np.zeros((0, width), np.bool_), [])
        prefix, suffix = self._prefix, self._suffix
        keys = [f"{prefix}{e}{suffix}".encode() for e in entities]
        client = self._client
        bad: list[Problem | None] = [None] * m
        if isinstance(client, redis.RedisCluster):
            gets = [b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k) for k in keys]
            blobs, errors = cluster_round_trip(client, gets, keys, self._command)
            if errors:  # a reply per key: one refused key is its entity's problem
                refused = settle(self._command, errors, lambda i: keys[i].decode())
                for i, reason in refused.items():
                    bad[i] = ("feature_store_error", reason)
        else:
            parts = [b"*%d\r\n$4\r\nMGET\r\n" % (m + 1)]
            parts += [b"$%d\r\n%s\r\n" % (len(k), k) for k in keys]
            (blobs,), errors = round_trip(client, b"".join(parts), 1, self._command)
            if errors:
                settle(self._command, errors, None)  # one reply for all keys: names none

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

    def close(self) -> None:
        self._client.close()


def pack_vector(values: Sequence[float] | npt.NDArray[np.floating[Any]]) -> bytes:
    """The ``packed`` layout's value for one entity: float32 little-endian, field order."""
    return np.asarray(values, dtype="<f4").tobytes()


STORES: dict[str, type[RedisHashStore] | type[RedisPackedStore]] = {
    "hash": RedisHashStore,
    "packed": RedisPackedStore,
}


def connect_store(settings: RedisSettings, spec: FeatureSpec) -> RedisHashStore | RedisPackedStore:
    """The store for the spec's layout."""
    return STORES[spec.layout].connect(settings, spec)


@dataclass(frozen=True, slots=True)
class Assembled:
    """The feature matrix of a batch's requests and the rows that could not be filled."""

    matrix: npt.NDArray[np.float32]
    rejected: list[tuple[int, str, str]]
    """(row, code, reason) for each request row that must become a dead letter."""
    lookups: int = 0
    """Distinct entities looked up in the store."""
    misses: int = 0
    """Of those, entities the store had nothing for."""


def assemble(
    spec: FeatureSpec,
    entities: Sequence[str | None],
    inline: Sequence[dict[str, float] | None],
    store: FeatureStore,
) -> Assembled:
    """Build the (rows x fields) float32 matrix with one store call. Raises FeatureStoreError
    (an outage) or FeatureStoreConfigError; a problem of one entity is a rejection."""
    n, width = len(entities), len(spec.fields)
    matrix = np.full((n, width), spec.default_value, dtype=np.float32)
    rejected: list[tuple[int, str, str]] = []
    lookups = misses = 0

    lookup_rows = [r for r in range(n) if entities[r] is not None and len(inline[r] or ()) < width]
    if lookup_rows:
        distinct = list(dict.fromkeys(entities[r] for r in lookup_rows))
        fetched = store.fetch(distinct)  # type: ignore[arg-type]
        if fetched.values.shape != (len(distinct), width):
            raise FeatureStoreError(
                f"feature store answered {fetched.values.shape[0]} rows for {len(distinct)} "
                f"entities (expected {width} values each)"
            )
        values, absent, bad = fetched.values, fetched.absent, fetched.bad
        unknown: npt.NDArray[np.bool_] = np.asarray(absent.all(axis=1))
        lookups, misses = len(distinct), int(unknown.sum())
        partial: npt.NDArray[np.bool_] = np.asarray(absent.any(axis=1)) & ~unknown
        position = {entity: i for i, entity in enumerate(distinct)}
        idx = np.fromiter((position[entities[r]] for r in lookup_rows), np.intp, len(lookup_rows))
        rows = np.asarray(lookup_rows, dtype=np.intp)
        filled = np.where(absent, np.float32(spec.default_value), values)
        matrix[rows] = filled[idx]
        troubled = np.fromiter((b is not None for b in bad), np.bool_, len(bad))
        if spec.on_missing_entity == "dead_letter":
            troubled |= unknown
        if spec.on_missing_field == "dead_letter":
            troubled |= partial
        if troubled.any():
            for j in np.flatnonzero(troubled[idx]).tolist():
                r = lookup_rows[j]
                e = int(idx[j])
                problem = bad[e]
                if problem is not None:
                    code, why = problem
                    rejected.append((r, code, why))
                    continue
                missing = _missing_names(inline[r], absent[e], spec)
                if not missing:
                    continue  # the request carried what the store lacks
                if unknown[e]:
                    reason = f"no features for entity {entities[r]!r}"
                    rejected.append((r, "unknown_entity", reason))
                else:
                    reason = f"entity {entities[r]!r} lacks fields {missing}"
                    rejected.append((r, "missing_feature", reason))

    column = {name: j for j, name in enumerate(spec.fields)}
    fields = spec.fields
    with np.errstate(over="ignore"):  # beyond float32 range becomes inf, refused below
        for r in range(n):
            feats = inline[r]
            if not feats:
                continue
            if len(feats) == width:  # every feature inline: one row write
                matrix[r] = [feats[name] for name in fields]
            else:
                for name, v in feats.items():
                    matrix[r, column[name]] = v

    finite = np.isfinite(matrix).all(axis=1)
    if not finite.all():
        already = {r for r, _, _ in rejected}
        for r in np.flatnonzero(~finite).tolist():
            if r not in already:
                rejected.append((r, "non_finite", "a feature value is NaN or infinite"))
    return Assembled(matrix, rejected, lookups, misses)


def _parse_rows(
    raw: list[RawRow], width: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_], list[Problem | None]]:
    """Convert raw values in one numpy call; fall back per entity only to name a bad one."""
    m = len(raw)
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
                        f"stored feature {j} is not a number: {v[:32]!r}",
                    )
                    break
    with np.errstate(over="ignore"):  # beyond float32 range becomes inf, refused later
        return values.astype(np.float32), absent, bad


def _missing_names(
    feats: dict[str, float] | None, absent: npt.NDArray[np.bool_], spec: FeatureSpec
) -> list[str]:
    """Fields absent from the store and not carried by the request."""
    given = feats or {}
    return [name for j, name in enumerate(spec.fields) if absent[j] and name not in given]
