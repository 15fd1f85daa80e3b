"""Decoding requests and encoding results and dead letters (JSON via orjson).

Decoding never raises for a bad record: it returns the good requests column by column
and a ``Rejection`` for each bad one, naming the check that failed. The checks mirror
``schemas/request.schema.json``; size is checked before parsing, and orjson itself
refuses NaN, Infinity, numbers that overflow a double and invalid UTF-8.

An ``entity`` id becomes part of a Redis key (``features.key_template``), so it may hold
only what cannot change which key it names or how Redis reads it: 1 to
``MAX_ENTITY_LENGTH`` ASCII letters, digits and ``. _ - @ +`` (``ENTITY_PATTERN``).
UUIDs, numeric ids and most e-mail addresses pass; ``:`` (a key namespace separator),
``{ }`` (cluster hash tags), glob characters, whitespace, control and non-ASCII
characters do not.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Collection, Sequence
from typing import Any

import orjson

from worker.limits import DEFAULT_MESSAGE_MAX_BYTES, RECORD_OVERHEAD
from worker.types import DecodedRequests, Rejection

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "ENTITY_PATTERN",
    "MAX_ENTITY_LENGTH",
    "MAX_ID_LENGTH",
    "MAX_REASON_LENGTH",
    "decode_requests",
    "encode_dead_letter",
    "safe_text",
]

MAX_ID_LENGTH = 256
MAX_ENTITY_LENGTH = 256
ENTITY_PATTERN = rf"[A-Za-z0-9._@+-]{{1,{MAX_ENTITY_LENGTH}}}"
"""What a whole entity id must match; ``schemas/request.schema.json`` says the same."""
MAX_REASON_LENGTH = 512
DEAD_LETTER_MAX_BYTES = DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD
"""A dead letter's body and key together, when the sink's limits are not known."""

_NUMBER = (int, float)
_entity_ok = re.compile(ENTITY_PATTERN).fullmatch


def decode_requests(
    values: Sequence[bytes | None],
    fields: Collection[str],
    max_record_bytes: int,
) -> DecodedRequests:
    """Parse and check one batch of request values. Never raises for bad input."""
    rows: list[int] = []
    ids: list[str] = []
    entities: list[str | None] = []
    inline: list[dict[str, float] | None] = []
    rejections: list[Rejection] = []
    loads = orjson.loads
    known = fields if isinstance(fields, (set, frozenset)) else frozenset(fields)
    n_fields = len(known)

    for index, value in enumerate(values):
        if not value:
            rejections.append(Rejection(index, "decode", "empty_value", "record value is empty"))
            continue
        if len(value) > max_record_bytes:
            rejections.append(
                Rejection(
                    index,
                    "decode",
                    "oversized",
                    f"record value is {len(value)} bytes, over the limit of {max_record_bytes}",
                )
            )
            continue
        try:
            doc = loads(value)
        except orjson.JSONDecodeError as exc:
            rejections.append(Rejection(index, "decode", "invalid_json", f"not valid JSON: {exc}"))
            continue
        if type(doc) is not dict:
            rejections.append(
                Rejection(
                    index,
                    "schema",
                    "not_an_object",
                    f"request must be a JSON object, got {_json_type(doc)}",
                )
            )
            continue
        problem = _check(doc, known, n_fields)
        if problem is not None:
            rejections.append(Rejection(index, "schema", problem[0], problem[1]))
            continue
        rows.append(index)
        ids.append(doc["id"])
        entities.append(doc.get("entity"))
        inline.append(doc.get("features"))
    return DecodedRequests(rows, ids, entities, inline, rejections)


def _check(doc: dict[str, Any], known: Collection[str], n_fields: int) -> tuple[str, str] | None:
    rid = doc.get("id")
    if rid is None:
        return "missing_field", "field 'id' is required"
    if type(rid) is not str:
        return "wrong_type", f"field 'id' must be a string, got {_json_type(rid)}"
    if not rid or len(rid) > MAX_ID_LENGTH:
        return "invalid_id", f"field 'id' must be 1 to {MAX_ID_LENGTH} characters"
    entity = doc.get("entity")
    if entity is not None:
        if type(entity) is not str:
            return "wrong_type", f"field 'entity' must be a string, got {_json_type(entity)}"
        if _entity_ok(entity) is None:
            return "invalid_entity", (
                f"field 'entity' must be 1 to {MAX_ENTITY_LENGTH} of A-Z a-z 0-9 . _ - @ +, "
                f"got {safe_text(entity[:80], 64)!r}"
            )
    feats = doc.get("features")
    if feats is not None:
        if type(feats) is not dict:
            return "wrong_type", f"field 'features' must be an object, got {_json_type(feats)}"
        for name, v in feats.items():
            if name not in known:
                return "unknown_feature", f"feature {safe_text(name, 64)!r} is not in the spec"
            if type(v) not in _NUMBER:
                return "wrong_type", f"feature {name!r} must be a number, got {_json_type(v)}"
            if not math.isfinite(v):
                return "non_finite", f"feature {name!r} is not finite"
        if entity is None and len(feats) < n_fields:
            missing = sorted(set(known) - set(feats))[:5]
            return "missing_field", f"no 'entity' and features lack {missing}"
    elif entity is None:
        return "missing_field", "request needs 'entity' or 'features'"
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, _NUMBER):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def safe_text(text: str, limit: int = MAX_REASON_LENGTH) -> str:
    """Printable ASCII only, cut to ``limit``: safe for headers, logs and terminals."""
    cleaned = text.encode("ascii", "backslashreplace").decode("ascii")
    cleaned = "".join(c if 32 <= ord(c) < 127 else f"\\x{ord(c):02x}" for c in cleaned)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def encode_dead_letter(
    *,
    pipeline: str,
    stage: str,
    code: str,
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    max_value_bytes: int,
    request_id: str | None,
    worker_version: str,
    model: str | None,
    max_bytes: int = DEAD_LETTER_MAX_BYTES,
) -> tuple[bytes, bytes | None]:
    """The dead-letter body and its Kafka key: why, where from, and as much of the
    original key and value as fits in ``max_bytes`` (body and key together, so the
    broker takes it whatever the request held).

    The Kafka key is the request's when it takes at most a quarter of the room (so dead
    letters keep the requests' partitioning); ``key_b64`` and ``value_b64`` then hold the
    original bytes, or their first bytes with ``key_truncated`` / ``value_truncated``
    set, or null. A value over ``max_value_bytes`` was never parsed and is left out;
    ``source`` locates every original record."""
    value_bytes = len(value) if value is not None else 0
    doc: dict[str, Any] = {
        "pipeline": pipeline,
        "stage": stage,
        "code": code,
        "reason": safe_text(reason),
        "request_id": request_id,
        "source": {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "timestamp_ms": timestamp_ms,
        },
        "key_b64": None,
        "key_bytes": len(key) if key is not None else 0,
        "key_truncated": False,
        "value_b64": None,
        "value_bytes": value_bytes,
        "value_truncated": value is not None and value_bytes > max_value_bytes,
        "worker_version": worker_version,
        "model": model,
    }
    room = max_bytes - len(orjson.dumps(doc))
    kafka_key = None
    if key is not None:
        if len(key) <= room // 4:
            kafka_key = key
            room -= len(key)
        doc["key_b64"], doc["key_truncated"], room = _embed(key, room)
    if value is not None and value_bytes <= max_value_bytes:
        doc["value_b64"], doc["value_truncated"], room = _embed(value, room)
    return orjson.dumps(doc), kafka_key


def _embed(data: bytes, room: int) -> tuple[str | None, bool, int]:
    """``data`` base64-encoded, cut to what ``room`` bytes of JSON hold (a string in place
    of ``null`` costs its length less two); whether it was cut; the room left."""
    take = min(len(data), max(0, (room + 2) // 4 * 3))
    if take == 0 and data:
        return None, True, room
    text = base64.b64encode(data[:take]).decode()
    return text, take < len(data), room - (len(text) - 2)
