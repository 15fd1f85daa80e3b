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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import redis

from worker.config import FeatureSpec, RedisSettings
from worker.errors import FeatureStoreConfigError, FeatureStoreError

__all__ = [
    "PROBE_ENTITY",
    "REDIS_ERROR_KINDS",
    "STORES",
    "Assembled",
    "FeatureStore",
    "Fetched",
    "RedisHashStore",
    "RedisPackedStore",
    "RedisTrouble",
    "RowStore",
    "assemble",
    "classify_redis_error",
    "connect_store",
    "pack_vector",
]

RawRow = Sequence[bytes | str | None]

PROBE_ENTITY = "streamfer-probe"
"""The entity whose key ``probe`` reads at start-up; a valid entity id, absent in practice."""

RedisTrouble = Literal["record", "outage", "config"]
"""What a Redis error means for a batch: ``record``, the requests of that one entity are
dead letters; ``outage``, the batch waits and retries; ``config``, an operator must act."""

REDIS_ERROR_KINDS: dict[str, RedisTrouble] = {
    # about the one key the command names
    "WRONGTYPE": "record",
    # the server is there but cannot answer now
    "LOADING": "outage",
    "BUSY": "outage",
    "MASTERDOWN": "outage",
    "TRYAGAIN": "outage",
    "CLUSTERDOWN": "outage",
    # how this worker is set up against this server
    "NOPERM": "config",
    "NOAUTH": "config",
    "WRONGPASS": "config",
    "CROSSSLOT": "config",
    "MOVED": "config",
    "ASK": "config",
}
"""Error reply codes (the reply's first word) by kind. Any other code, ``ERR`` included
(an unknown or renamed command, wrong arguments), counts as ``config``: a reply nobody
here can explain must not cost records, and readiness shows it word for word."""

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

    def __init__(self, client: redis.Redis, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        encoded = [f.encode() for f in spec.fields]
        self._head = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(encoded))
        self._tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in encoded)
        self._command = _Command.of("HMGET", client, spec)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisHashStore:
        return cls(redis_client(settings), spec)

    def ping(self) -> None:
        _ping(self._client)

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
        parts: list[bytes] = []
        append = parts.append
        for entity in entities:
            key = f"{prefix}{entity}{suffix}".encode()
            append(head)
            append(b"$%d\r\n%s\r\n" % (len(key), key))
            append(tail)
        rows: list[RawRow]
        rows, errors = _round_trip(self._client, b"".join(parts), len(entities), self._command)
        if not errors:
            return rows, {}
        refused = _settle(self._command, errors, lambda i: f"{prefix}{entities[i]}{suffix}")
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

    def __init__(self, client: redis.Redis, spec: FeatureSpec) -> None:
        self._client = client
        self._prefix, self._suffix = spec.key_template.split("{entity}", 1)
        self.fields = list(spec.fields)
        self._row_bytes = 4 * len(spec.fields)
        self._command = _Command.of("MGET", client, spec)

    @classmethod
    def connect(cls, settings: RedisSettings, spec: FeatureSpec) -> RedisPackedStore:
        return cls(redis_client(settings), spec)

    def ping(self) -> None:
        _ping(self._client)

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
        parts = [b"*%d\r\n$4\r\nMGET\r\n" % (m + 1)]
        parts += [b"$%d\r\n%s\r\n" % (len(k), k) for k in keys]
        (blobs,), errors = _round_trip(self._client, b"".join(parts), 1, self._command)
        if errors:
            _settle(self._command, errors, None)  # one reply for all keys: names none of them
        bad: list[Problem | None] = [None] * m
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


def classify_redis_error(exc: redis.RedisError) -> tuple[RedisTrouble, str]:
    """What ``exc`` means for a batch, and its error code (``ERR`` when it names none).

    Refused credentials are ``config``; any other failure to connect, send or read (a
    timeout, LOADING, a garbled reply) is an ``outage``; an error reply is judged by its
    code, ``REDIS_ERROR_KINDS``.
    """
    code = _error_code(exc)
    if isinstance(exc, _CREDENTIAL_ERRORS):
        return "config", code
    if not isinstance(exc, redis.ResponseError):
        return "outage", code
    return REDIS_ERROR_KINDS.get(code, "config"), code


_CREDENTIAL_ERRORS = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)

# For redis-py releases whose errors carry no ``status_code``: the classes it parses
# replies into, most specific first (MovedError is an AskError, MasterDownError a
# ClusterDownError).
_CODE_OF_CLASS: tuple[tuple[type[redis.RedisError], str], ...] = (
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.ClusterCrossSlotError, "CROSSSLOT"),
)


def _error_code(exc: redis.RedisError) -> str:
    """The reply's code: redis-py keeps it aside for the codes it knows (and strips it
    from the text), leaves it in the text for the others."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    for cls, name in _CODE_OF_CLASS:
        if isinstance(exc, cls):
            return name
    if isinstance(exc, redis.exceptions.AuthenticationError):  # three replies, one class
        text = str(exc)
        if "username-password" in text:
            return "WRONGPASS"
        if text.startswith("Authentication required"):
            return "NOAUTH"
    head = str(exc).split(" ", 1)[0]
    return head if head.isalpha() and head.isupper() else "ERR"


def _reply_text(exc: redis.RedisError, code: str) -> str:
    """The error as Redis sent it, code first."""
    text = str(exc)
    return text if text.startswith(code) else f"{code} {text}"


@dataclass(frozen=True, slots=True)
class _Command:
    """The command a store sends per batch, to name it, and what to grant, in errors."""

    name: str
    pattern: str
    """The ACL key pattern the store's keys fall under, e.g. ``features:*``."""
    user: str
    """The ACL user the client logs in as."""

    @classmethod
    def of(cls, name: str, client: redis.Redis, spec: FeatureSpec) -> _Command:
        user = client.connection_pool.connection_kwargs.get("username") or "default"
        return cls(name, spec.key_template.replace("{entity}", "*"), str(user))

    def failed(
        self, exc: redis.RedisError, *, key: str | None = None, outage: str | None = None
    ) -> FeatureStoreError | FeatureStoreConfigError:
        """The error to raise for ``exc``, which concerns the whole batch: ``outage`` (a
        message prefix) when it is one, else what an operator has to change."""
        kind, code = classify_redis_error(exc)
        replied = isinstance(exc, redis.ResponseError) or code != "ERR"  # LOADING, WRONGPASS
        text = _reply_text(exc, code) if replied else str(exc)
        if kind == "outage":
            return FeatureStoreError(f"{outage or f'Redis cannot answer {self.name} now'}: {text}")
        where = f" of key {key!r}" if key is not None else ""
        return FeatureStoreConfigError(
            f"Redis refused {self.name}{where}: {text.rstrip('.')}; {self._advice(exc, code)}"
        )

    def _advice(self, exc: redis.RedisError, code: str) -> str:
        if code == "NOPERM":
            return (
                f"the ACL user {self.user!r} needs {self.name} on keys {self.pattern!r}: "
                f"ACL SETUSER {self.user} +{self.name.lower()} ~{self.pattern}"
            )
        if isinstance(exc, _CREDENTIAL_ERRORS) or code in ("NOAUTH", "WRONGPASS"):
            return (
                "set redis.username and redis.password (or the user and password in "
                "redis.url) to credentials this server accepts"
            )
        if code in ("MOVED", "ASK", "CROSSSLOT"):
            return (
                "redis.url names a Redis Cluster node, and streamfer sends each batch to one "
                "node: point redis.url at a standalone Redis or a proxy that routes keys"
            )
        if "unknown command" in str(exc).lower():
            return f"this server does not accept {self.name} (renamed or disabled?): enable it"
        return "fix the Redis server or the [redis] settings; the worker retries until then"


def _round_trip(
    client: redis.Redis, payload: bytes, replies: int, command: _Command
) -> tuple[list[Any], dict[int, redis.ResponseError]]:
    """Send pre-encoded RESP commands in one write and read ``replies`` answers (parsed by
    hiredis when installed); an error reply leaves None in its place and is returned by
    position, for the caller to judge. Raises FeatureStoreError when Redis cannot be
    reached or the connection fails, FeatureStoreConfigError when it refuses the login."""
    pool = client.connection_pool
    try:
        conn: Any = pool.get_connection()
    except redis.RedisError as exc:
        raise command.failed(exc, outage="Redis is not reachable") from exc
    answers: list[Any] = []
    errors: dict[int, redis.ResponseError] = {}
    try:
        conn.send_packed_command([payload])
        read, append = conn.read_response, answers.append
        for i in range(replies):
            try:
                append(read())
            except redis.ResponseError as exc:  # one whole reply was read: still in step
                errors[i] = exc
                append(None)
    except redis.RedisError as exc:
        conn.disconnect()
        outage = f"Redis round trip of {replies} {command.name}s failed"
        raise command.failed(exc, outage=outage) from exc
    finally:
        pool.release(conn)
    return answers, errors


def _settle(
    command: _Command,
    errors: dict[int, redis.ResponseError],
    key_of: Callable[[int], str] | None,
) -> dict[int, str]:
    """Dead-letter reasons, by position, for the replies Redis refused about their own
    key (``key_of`` names it; None when a reply covers several keys). Raises when any
    refusal concerns the whole batch: FeatureStoreConfigError before FeatureStoreError."""
    refused: dict[int, str] = {}
    worst: tuple[RedisTrouble, int] | None = None
    for i, exc in errors.items():
        kind, code = classify_redis_error(exc)
        if kind == "record" and key_of is not None:
            refused[i] = (
                f"Redis refused {command.name} of key {key_of(i)!r}: {_reply_text(exc, code)}"
            )
        elif worst is None or worst[0] == "outage":
            worst = (kind, i)
    if worst is not None:
        i = worst[1]
        raise command.failed(errors[i], key=key_of(i) if key_of is not None else None)
    return refused


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
