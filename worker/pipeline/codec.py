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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson

from worker.core import DecodedRequests, Rejection, safe_text
from worker.kafka import DEFAULT_MESSAGE_MAX_BYTES, RECORD_OVERHEAD
from worker.pipeline.request_shape import RequestShape
from worker.registry import RecordUndecodable

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "ENTITY_PATTERN",
    "MAX_ENTITY_LENGTH",
    "MAX_ID_LENGTH",
    "decode_requests",
    "encode_dead_letter",
    "open_objects",
    "request_id_of",
    "result_tail",
]

MAX_ID_LENGTH = 256
MAX_ENTITY_LENGTH = 256
ENTITY_PATTERN = rf"[A-Za-z0-9._@+-]{{1,{MAX_ENTITY_LENGTH}}}"
"""What a whole entity id must match; ``schemas/request.schema.json`` says the same."""
DEAD_LETTER_MAX_BYTES = DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD
"""A dead letter's body and key together, when the sink's limits are not known."""

_NUMBER = (int, float)
_entity_ok = re.compile(ENTITY_PATTERN).fullmatch


def decode_requests(
    values: Sequence[bytes | None],
    shape: RequestShape,
    max_record_bytes: int,
    loads: Callable[[bytes], Any] | None = None,
) -> DecodedRequests:
    """Parse and check one batch of request values. Never raises for bad input.

    ``loads`` reads a value that is not JSON (a Schema Registry format's, from
    ``FramedRequests.for_batch``) into the document a JSON request parses to; it raises
    ``RecordUndecodable`` for a bad value."""
    rows: list[int] = []
    ids: list[str] = []
    entities: dict[str, list[str | None]] = {name: [] for name, _, _ in shape.lookups}
    inline: list[dict[str, Any] | None] = []
    docs: list[dict[str, Any]] = []
    rejections: list[Rejection] = []
    if loads is None:
        loads = orjson.loads
    check = _Checker(shape)
    # The common request, top-level id and one entity id, with no inline features or
    # only numbers for number features, is taken here in a few dict look-ups; anything
    # else (and anything this refuses) goes through the full check, which names why.
    quick = (
        len(shape.id_path) == 1
        and len(shape.features_path) == 1
        and len(shape.lookups) == 1
        and len(shape.lookups[0][1]) == 1
    )
    id_key, feats_key = shape.id_path[0], shape.features_path[0]
    entity_key = shape.lookups[0][1][0] if shape.lookups else ""
    column = entities[shape.lookups[0][0]] if quick else []
    entity_ok = _entity_ok
    numbers = (
        frozenset(name for name, kind in shape.kinds.items() if kind == "number")
        if shape.features_array is None
        else frozenset()
    )

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
        except RecordUndecodable as exc:
            rejections.append(Rejection(index, "decode", exc.code, exc.reason))
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
        if quick:
            rid = doc.get(id_key)
            entity = doc.get(entity_key)
            feats = doc.get(feats_key)
            if (
                type(rid) is str
                and 0 < len(rid) <= MAX_ID_LENGTH
                and type(entity) is str
                and entity_ok(entity) is not None
                and (feats is None or (type(feats) is dict and _plain_numbers(feats, numbers)))
            ):
                rows.append(index)
                ids.append(rid)
                column.append(entity)
                inline.append(feats)
                docs.append(doc)
                continue
        checked = check(doc)
        if isinstance(checked, _Problem):
            rejections.append(Rejection(index, "schema", checked.code, checked.reason, check.rid))
            continue
        rid, ents, feats = checked
        rows.append(index)
        ids.append(rid)
        for name, entity in zip(entities, ents, strict=True):
            entities[name].append(entity)
        inline.append(feats)
        docs.append(doc)
    return DecodedRequests(rows, ids, entities, inline, rejections, docs)


def _plain_numbers(feats: dict[str, Any], numbers: frozenset[str]) -> bool:
    """Whether every inline feature is a number feature holding a finite JSON number: what
    the full check accepts without looking further."""
    if not feats.keys() <= numbers:
        return False
    for v in feats.values():
        t = type(v)
        if t is float:
            if v - v != 0.0:  # NaN or infinity (orjson refuses them; a loads hook may not)
                return False
        elif t is not int:
            return False
    return True


_Good = tuple[str, list[str | None], dict[str, Any] | None]


class _Problem(NamedTuple):
    code: str
    reason: str


class _Checker:
    """Checks one request against a ``RequestShape``: its id, entity ids and inline
    features, or why not, as (code, reason)."""

    __slots__ = ("_array", "_feats", "_id", "_id_name", "_kinds", "_lookups", "rid")

    def __init__(self, shape: RequestShape) -> None:
        self._id = shape.id_path
        self._id_name = ".".join(shape.id_path)
        self._feats = shape.features_path
        self._array = shape.features_array
        self._lookups = [(path, ".".join(path), fields) for _, path, fields in shape.lookups]
        self._kinds = shape.kinds
        self.rid: str | None = None
        """The id of the request last checked, once it passed: its dead letter names it."""

    def __call__(self, doc: dict[str, Any]) -> _Good | _Problem:
        self.rid = None
        rid = doc.get(self._id[0]) if len(self._id) == 1 else _at(doc, self._id)
        name = self._id_name
        if rid is None:
            return _Problem("missing_field", f"field {name!r} is required")
        if type(rid) is not str:
            return _Problem("wrong_type", f"field {name!r} must be a string, got {_json_type(rid)}")
        if not rid or len(rid) > MAX_ID_LENGTH:
            return _Problem("invalid_id", f"field {name!r} must be 1 to {MAX_ID_LENGTH} characters")
        self.rid = rid
        raw = doc.get(self._feats[0]) if len(self._feats) == 1 else _at(doc, self._feats)
        feats: dict[str, Any] | None = None
        if raw is not None:
            checked = self._features(raw)
            if type(checked) is _Problem:
                return checked
            feats = checked  # type: ignore[assignment]
        entities: list[str | None] = []
        for path, where, fields in self._lookups:
            entity = doc.get(path[0]) if len(path) == 1 else _at(doc, path)
            if entity is None:
                if fields and (feats is None or any(f not in feats for f in fields)):
                    if feats is None and len(self._lookups) == 1:
                        return _Problem("missing_field", f"request needs {where!r} or 'features'")
                    missing = sorted(f for f in fields if feats is None or f not in feats)[:5]
                    return _Problem("missing_field", f"no {where!r} and features lack {missing}")
                entities.append(None)
                continue
            if type(entity) is int:
                entity = str(entity)  # numeric ids name keys as their digits
            elif type(entity) is not str:
                return _Problem(
                    "wrong_type", f"field {where!r} must be a string, got {_json_type(entity)}"
                )
            if _entity_ok(entity) is None:
                return _Problem(
                    "invalid_entity",
                    f"field {where!r} must be 1 to {MAX_ENTITY_LENGTH} of A-Z a-z 0-9 . _ - @ +, "
                    f"got {safe_text(entity[:80], 64)!r}",
                )
            entities.append(entity)
        return rid, entities, feats

    def _features(self, raw: Any) -> dict[str, Any] | _Problem:
        where = ".".join(self._feats)
        if self._array is not None:
            if type(raw) is not list:
                return _Problem(
                    "wrong_type", f"field {where!r} must be an array, got {_json_type(raw)}"
                )
            if len(raw) != len(self._array):
                return _Problem(
                    "wrong_type",
                    f"field {where!r} must hold {len(self._array)} values "
                    f"({list(self._array)[:5]}...), got {len(raw)}",
                )
            raw = dict(zip(self._array, raw, strict=True))
        elif type(raw) is not dict:
            return _Problem(
                "wrong_type", f"field {where!r} must be an object, got {_json_type(raw)}"
            )
        kinds = self._kinds
        for name, v in raw.items():
            kind = kinds.get(name)
            if kind is None:
                return _Problem(
                    "unknown_feature", f"feature {safe_text(name, 64)!r} is not in the spec"
                )
            t = type(v)
            if kind == "text":
                if t is not str:
                    return _Problem(
                        "wrong_type", f"feature {name!r} must be a string, got {_json_type(v)}"
                    )
            elif t is bool:
                if kind != "bool":
                    return _Problem("wrong_type", f"feature {name!r} must be a number, got boolean")
            elif t not in _NUMBER:
                return _Problem(
                    "wrong_type", f"feature {name!r} must be a number, got {_json_type(v)}"
                )
            elif not math.isfinite(v):
                return _Problem("non_finite", f"feature {name!r} is not finite")
        return raw  # type: ignore[no-any-return]


def request_id_of(value: bytes | None, shape: RequestShape, max_record_bytes: int) -> str | None:
    """The id of a request that is not decoded as a whole (its dead letter names it), or
    None where there is no readable one. Never raises."""
    if not value or len(value) > max_record_bytes:
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    rid = _at(doc, shape.id_path)
    return rid if type(rid) is str and 0 < len(rid) <= MAX_ID_LENGTH else None


def _at(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The value at a dotted path, or None when any step is missing or not an object."""
    node: Any = doc
    for key in path:
        if type(node) is not dict:
            return None
        node = node.get(key)
    return node


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


def open_objects(docs: list[dict[str, Any]], first: str) -> list[bytes]:
    """Each of ``docs`` as a JSON object without its closing brace, for a tail to be
    spliced in; every doc's first key is ``first``.

    One ``orjson.dumps`` of the whole list, cut at each ``},{"first":``, costs a tenth of
    a call per doc. The cut is sound: inside a JSON string every quote is escaped, so
    that sequence only appears where one doc ends and the next begins, or inside a
    nested object with the same key, which yields more pieces than docs; then (and for
    fewer than two docs) each doc is encoded on its own."""
    if len(docs) > 1:
        head = b"{" + orjson.dumps(first) + b":"
        joint = orjson.dumps(docs)
        pieces = joint[1 + len(head) : -2].split(b"}," + head)
        if len(pieces) == len(docs) and joint.startswith(b"[" + head):
            return [head + piece for piece in pieces]
    return [orjson.dumps(doc)[:-1] for doc in docs]


def result_tail(shared: dict[str, Any]) -> bytes:
    """What every result of a batch shares (model, pipeline, timings ...), encoded once
    per batch: a result is its own fields encoded without the closing brace, then this."""
    return b"," + orjson.dumps(shared)[1:]


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
    delivery_count: int | None = None,
) -> tuple[bytes, bytes | None]:
    """The dead-letter body and its Kafka key: why, where from, and as much of the
    original key and value as fits in ``max_bytes`` (body and key together, so the
    broker takes it whatever the request held).

    The Kafka key is the request's when it takes at most a quarter of the room (so dead
    letters keep the requests' partitioning); ``key_b64`` and ``value_b64`` then hold the
    original bytes, or their first bytes with ``key_truncated`` / ``value_truncated``
    set, or null. A value over ``max_value_bytes`` was never parsed and is left out;
    ``source`` locates every original record. ``delivery_count`` (a share group's
    deliveries of the request) is written only when given."""
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
    if delivery_count is not None:
        doc["delivery_count"] = delivery_count
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
