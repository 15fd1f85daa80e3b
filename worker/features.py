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

__all__ = [
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


@dataclass(frozen=True, slots=True)
class Fetched:
    """Feature values of distinct entities, in the spec's field order."""

    values: npt.NDArray[np.float32]
    absent: npt.NDArray[np.bool_]
    bad: list[str | None]
    """Per entity: why its stored values are unusable, or None."""

    @classmethod
    def from_raw(cls, raw: list[RawRow], width: int) -> Fetched:
        """Parse raw per-field values (None where absent). Raises FeatureStoreError when
        the store answered the wrong number of rows or values."""
        if any(len(row) != width for row in raw):
            raise FeatureStoreError(f"feature store answered rows without {width} values each")
        values, absent, bad = _parse_rows(raw, width)
        return cls(values, absent, bad)


class FeatureStore(Protocol):
    """Fetches the features of many entities in one round trip."""

    def fetch(self, entities: Sequence[str]) -> Fetched:
        """Rows aligned with ``entities``. Raises FeatureStoreError."""
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

    def __init__(self, client: redis.Redis, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        encoded = [f.encode() for f in spec.fields]
        self._head = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(encoded))
        self._tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in encoded)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisHashStore:
        return cls(redis_client(settings), spec)

    def ping(self) -> None:
        _ping(self._client)

    def get_many(self, entities: Sequence[str]) -> list[RawRow]:
        if not entities:
            return []
        prefix, suffix, head, tail = self._prefix, self._suffix, self._head, self._tail
        parts: list[bytes] = []
        append = parts.append
        for entity in entities:
            key = f"{prefix}{entity}{suffix}".encode()
            append(head)
            append(b"$%d\r\n%s\r\n" % (len(key), key))
            append(tail)
        rows: list[RawRow] = _round_trip(self._client, b"".join(parts), len(entities), "HMGET")
        return rows

    def close(self) -> None:
        self._client.close()


class RedisPackedStore:
    """Features as one little-endian float32 vector per entity: one MGET per batch.

    Parsing costs one ``np.frombuffer`` for the whole batch instead of one float() per
    value, so the fetch runs several times faster than hashes for the same features.
    """

    def __init__(self, client: redis.Redis, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        self._row_bytes = 4 * len(spec.fields)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisPackedStore:
        return cls(redis_client(settings), spec)

    def ping(self) -> None:
        _ping(self._client)

    def fetch(self, entities: Sequence[str]) -> Fetched:
        m, width, size = len(entities), len(self.fields), self._row_bytes
        if not entities:
            return Fetched(np.zeros((0, width), np.float32), np.zeros((0, width), np.bool_), [])
        prefix, suffix = self._prefix, self._suffix
        keys = [f"{prefix}{e}{suffix}".encode() for e in entities]
        parts = [b"*%d\r\n$4\r\nMGET\r\n" % (m + 1)]
        parts += [b"$%d\r\n%s\r\n" % (len(k), k) for k in keys]
        (blobs,) = _round_trip(self._client, b"".join(parts), 1, "MGET")
        bad: list[str | None] = [None] * m
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
                bad[i] = f"packed vector has {len(blob)} bytes, expected {size}"
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


def redis_client(settings: RedisSettings) -> redis.Redis:
    """A client for the configured Redis, with AUTH/ACL user and TLS CA when set.

    Connects lazily. Raises ``ConfigError`` for a URL redis-py would misread or refuse;
    its message and traceback hold no part of the URL, which may carry the password
    (settings built in code have not been through ``load_config``'s check).
    """
    from worker.errors import ConfigError

    url = settings.checked_url()
    extra: dict[str, Any] = {}
    if settings.username is not None:
        extra["username"] = settings.username
    if settings.password is not None:
        extra["password"] = settings.password.get_secret_value()
    if settings.ssl_ca_certs is not None:
        extra["ssl_ca_certs"] = str(settings.ssl_ca_certs)
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            **extra,
        )
    except (ValueError, TypeError):
        pass  # raised below, outside this block, so no exception context can quote the URL
    raise ConfigError(
        "redis.url: redis-py refused its query arguments (?name=value&...): check their "
        "names and values"
    ) from None


def _ping(client: redis.Redis) -> None:
    try:
        client.ping()
    except redis.RedisError as exc:
        raise FeatureStoreError(f"Redis is not reachable: {exc}") from exc


def _round_trip(client: redis.Redis, payload: bytes, replies: int, command: str) -> list[Any]:
    """Send pre-encoded RESP commands in one write and read ``replies`` answers (parsed by
    hiredis when installed). Raises FeatureStoreError."""
    pool = client.connection_pool
    try:
        conn: Any = pool.get_connection()
    except redis.RedisError as exc:
        raise FeatureStoreError(f"Redis is not reachable: {exc}") from exc
    try:
        conn.send_packed_command([payload])
        read = conn.read_response
        answers = [read() for _ in range(replies)]
    except redis.RedisError as exc:
        conn.disconnect()
        raise FeatureStoreError(f"Redis round trip of {replies} {command}s failed: {exc}") from exc
    finally:
        pool.release(conn)
    for answer in answers:
        if isinstance(answer, redis.ResponseError):
            raise FeatureStoreError(f"Redis refused {command}: {answer}")
    return answers


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
    """Build the (rows x fields) float32 matrix with one store call. Raises FeatureStoreError."""
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
                    rejected.append((r, "bad_feature_value", problem))
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
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_], list[str | None]]:
    """Convert raw values in one numpy call; fall back per entity only to name a bad one."""
    m = len(raw)
    flat: list[Any] = [v for row in raw for v in row]
    if None in flat:
        absent = np.fromiter((v is None for v in flat), np.bool_, len(flat)).reshape(m, width)
        flat = [b"0" if v is None else v for v in flat]
    else:
        absent = np.zeros((m, width), dtype=np.bool_)
    bad: list[str | None] = [None] * m
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
                    bad[i] = f"stored feature {j} is not a number: {v[:32]!r}"
                    break
    with np.errstate(over="ignore"):  # beyond float32 range becomes inf, refused later
        return values.astype(np.float32), absent, bad


def _missing_names(
    feats: dict[str, float] | None, absent: npt.NDArray[np.bool_], spec: FeatureSpec
) -> list[str]:
    """Fields absent from the store and not carried by the request."""
    given = feats or {}
    return [name for j, name in enumerate(spec.fields) if absent[j] and name not in given]
