"""Feature enrichment: one pipelined Redis round trip per batch, assembled into float32.

``FeatureStore`` is the plug-in point: ``get_many(entities)`` returns, for each distinct
entity, the raw values of the spec's fields (``None`` where absent). ``assemble`` turns
those and any features a request carried inline into one preallocated matrix, applying
the spec's policy for a missing entity or field; rows it cannot fill are returned as
rejections rather than raised.
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

__all__ = ["Assembled", "FeatureStore", "RedisHashStore", "assemble"]

RawRow = Sequence[bytes | str | None]


class FeatureStore(Protocol):
    """Fetches the raw field values of many entities in one round trip."""

    def get_many(self, entities: Sequence[str]) -> list[RawRow]:
        """Values aligned with ``entities`` and the spec's fields. Raises FeatureStoreError."""
        ...


class RedisHashStore:
    """Features as Redis hashes: one HMGET per distinct entity, all in one round trip.

    Hashes are the layout other tools write, so existing feature pipelines interoperate.
    The pipelined commands are encoded here as one RESP buffer (the field list is encoded
    once, not per entity), since redis-py's per-command packing costs more than Redis
    itself at batch sizes in the hundreds.
    """

    def __init__(self, client: redis.Redis, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self._fields = list(spec.fields)
        encoded = [f.encode() for f in spec.fields]
        self._head = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(encoded))
        self._tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in encoded)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisHashStore:
        extra: dict[str, Any] = {}
        if settings.username is not None:
            extra["username"] = settings.username
        if settings.password is not None:
            extra["password"] = settings.password.get_secret_value()
        if settings.ssl_ca_certs is not None:
            extra["ssl_ca_certs"] = str(settings.ssl_ca_certs)
        client = redis.Redis.from_url(
            settings.url.get_secret_value(),
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            **extra,
        )
        return cls(client, spec)

    def ping(self) -> None:
        try:
            self._client.ping()
        except redis.RedisError as exc:
            raise FeatureStoreError(f"Redis is not reachable: {exc}") from exc

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
        pool = self._client.connection_pool
        try:
            conn: Any = pool.get_connection()
        except redis.RedisError as exc:
            raise FeatureStoreError(f"Redis is not reachable: {exc}") from exc
        try:
            conn.send_packed_command([b"".join(parts)])
            read = conn.read_response
            rows: list[RawRow] = [read() for _ in entities]
        except redis.RedisError as exc:
            conn.disconnect()
            raise FeatureStoreError(
                f"Redis pipeline of {len(entities)} HMGETs failed: {exc}"
            ) from exc
        finally:
            pool.release(conn)
        for row in rows:
            if isinstance(row, redis.ResponseError):
                raise FeatureStoreError(f"Redis refused HMGET: {row}")
        return rows

    def close(self) -> None:
        self._client.close()


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
        raw = store.get_many(distinct)  # type: ignore[arg-type]
        if len(raw) != len(distinct) or any(len(row) != width for row in raw):
            raise FeatureStoreError(
                f"feature store answered {len(raw)} rows for {len(distinct)} entities "
                f"(expected {width} values each)"
            )
        values, absent, bad = _parse_rows(raw, width)
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
    with np.errstate(over="ignore"):  # beyond float32 range becomes inf, refused below
        for r in range(n):
            feats = inline[r]
            if feats:
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
