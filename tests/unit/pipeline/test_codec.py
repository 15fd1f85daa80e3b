"""Decoding requests (never raises for bad input) and encoding dead letters."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.text import MAX_REASON_LENGTH, safe_text
from worker.core.types import DecodedRequests, Rejection
from worker.kafka.limits import DEFAULT_MESSAGE_MAX_BYTES
from worker.pipeline.codec import (
    DEAD_LETTER_MAX_BYTES,
    ENTITY_PATTERN,
    MAX_ENTITY_LENGTH,
    MAX_ID_LENGTH,
    _Checker,
    _Problem,
    decode_requests,
    encode_dead_letter,
    open_objects,
)
from worker.pipeline.request_shape import RequestShape

FIELDS = ("a", "b", "c")
LIMIT = 4096

Decode = Callable[..., DecodedRequests]


@pytest.fixture
def decode() -> Decode:
    def run(
        values: Sequence[bytes | None],
        fields: Sequence[str] = FIELDS,
        max_record_bytes: int = LIMIT,
    ) -> DecodedRequests:
        return decode_requests(values, RequestShape.simple(fields), max_record_bytes)

    return run


def js(doc: Any) -> bytes:
    return orjson.dumps(doc)


def only_rejection(out: DecodedRequests) -> Rejection:
    assert out.rows == []
    assert out.ids == []
    assert out.entities == {"entity": []}
    assert out.inline == []
    assert len(out.rejections) == 1
    return out.rejections[0]


# --- good requests ----------------------------------------------------------------


def test_request_with_entity(decode: Decode) -> None:
    out = decode([js({"id": "r1", "entity": "e1"})])
    assert out.rows == [0]
    assert out.ids == ["r1"]
    assert out.entities == {"entity": ["e1"]}
    assert out.inline == [None]
    assert out.rejections == []


def test_request_with_entity_and_partial_features(decode: Decode) -> None:
    out = decode([js({"id": "r1", "entity": "e1", "features": {"b": 2.5}})])
    assert out.rows == [0]
    assert out.inline == [{"b": 2.5}]


def test_request_with_complete_inline_features(decode: Decode) -> None:
    out = decode([js({"id": "r2", "features": {"a": 1, "b": -2.5, "c": 0}})])
    assert out.rows == [0]
    assert out.ids == ["r2"]
    assert out.entities == {"entity": [None]}
    assert out.inline == [{"a": 1, "b": -2.5, "c": 0}]
    assert out.rejections == []


def test_extra_top_level_fields_are_allowed(decode: Decode) -> None:
    out = decode([js({"id": "r", "entity": "e", "trace": {"x": [1, 2]}})])
    assert out.rows == [0]


def test_id_of_max_length_is_accepted(decode: Decode) -> None:
    out = decode([js({"id": "x" * MAX_ID_LENGTH, "entity": "e"})])
    assert out.ids == ["x" * MAX_ID_LENGTH]


def test_empty_batch(decode: Decode) -> None:
    out = decode([])
    assert (out.rows, out.ids, out.entities, out.inline, out.rejections) == (
        [],
        [],
        {"entity": []},
        [],
        [],
    )


def test_an_integer_entity_id_names_its_key_by_its_digits(decode: Decode) -> None:
    out = decode([js({"id": "r", "entity": 12345}), js({"id": "s", "entity": -7})])
    assert out.entities == {"entity": ["12345", "-7"]}
    assert out.rejections == []


# --- decode-stage rejections -----------------------------------------------------


@pytest.mark.parametrize("value", [b"", None])
def test_empty_value(decode: Decode, value: bytes | None) -> None:
    rej = only_rejection(decode([value]))
    assert (rej.index, rej.stage, rej.code) == (0, "decode", "empty_value")


def test_oversized_is_checked_before_parsing(decode: Decode) -> None:
    huge_and_invalid = b"{" * (LIMIT + 1)
    rej = only_rejection(decode([huge_and_invalid]))
    assert (rej.stage, rej.code) == ("decode", "oversized")
    assert str(LIMIT + 1) in rej.reason
    assert str(LIMIT) in rej.reason


def test_value_exactly_at_limit_is_parsed(decode: Decode) -> None:
    doc = js({"id": "r", "entity": "e"})
    out = decode([doc], max_record_bytes=len(doc))
    assert out.rows == [0]
    rej = only_rejection(decode([doc], max_record_bytes=len(doc) - 1))
    assert rej.code == "oversized"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b'{"id": "\xff\xfe", "entity": "e"}', id="invalid-utf8"),
        pytest.param(b'{"id": "r", "entity": "e"', id="truncated"),
        pytest.param(b'{"id": "r", "features": {"a": NaN, "b": 1, "c": 1}}', id="nan"),
        pytest.param(b'{"id": "r", "features": {"a": Infinity, "b": 1, "c": 1}}', id="inf"),
        pytest.param(b'{"id": "r", "features": {"a": -Infinity, "b": 1, "c": 1}}', id="-inf"),
        pytest.param(b'{"id": "r", "features": {"a": 1e400, "b": 1, "c": 1}}', id="1e400"),
        pytest.param(b'{"id": "r", "entity": "e"} trailing', id="trailing-garbage"),
        pytest.param(b"\x00\x01\x02", id="binary"),
    ],
)
def test_invalid_json(decode: Decode, value: bytes) -> None:
    rej = only_rejection(decode([value]))
    assert (rej.stage, rej.code) == ("decode", "invalid_json")
    assert rej.reason.startswith("not valid JSON")


def _nested(depth: int) -> bytes:
    return b'{"id": "r", "entity": "e", "x": ' + b"[" * depth + b"]" * depth + b"}"


def test_deep_nesting_is_rejected(decode: Decode) -> None:
    deep = _nested(5000)
    rej = only_rejection(decode([deep], max_record_bytes=len(deep)))
    assert (rej.stage, rej.code) == ("decode", "invalid_json")


def test_deep_nesting_under_size_limit_does_not_crash_the_process() -> None:
    # 300 000 levels fit in 600 kB, under the default 1 MiB record limit. A crash here
    # would be a poison pill: every worker that consumes the record dies.
    script = (
        "from worker.pipeline.codec import decode_requests\n"
        "from worker.pipeline.request_shape import RequestShape\n"
        "deep = b'{\"id\": \"r\", \"x\": ' + b'[' * 300000 + b']' * 300000 + b'}'\n"
        "out = decode_requests([deep], RequestShape.simple(['a']), 1 << 20)\n"
        "print(out.rows, [r.code for r in out.rejections])\n"
    )
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[] ['invalid_json']"


def test_moderate_nesting_in_extra_field_is_accepted(decode: Decode) -> None:
    out = decode([_nested(100)])
    assert out.rows == [0]
    assert out.rejections == []


# --- schema-stage rejections -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "json_type"),
    [(b"[1, 2]", "array"), (b"42", "number"), (b"null", "null"), (b'"s"', "string")],
)
def test_not_an_object(decode: Decode, value: bytes, json_type: str) -> None:
    rej = only_rejection(decode([value]))
    assert (rej.stage, rej.code) == ("schema", "not_an_object")
    assert json_type in rej.reason


@pytest.mark.parametrize(
    ("doc", "code", "mentions"),
    [
        pytest.param({"entity": "e"}, "missing_field", "'id'", id="missing-id"),
        pytest.param({"id": None, "entity": "e"}, "missing_field", "'id'", id="null-id"),
        pytest.param({"id": 7, "entity": "e"}, "wrong_type", "number", id="id-number"),
        pytest.param({"id": ["r"], "entity": "e"}, "wrong_type", "array", id="id-array"),
        pytest.param({"id": True, "entity": "e"}, "wrong_type", "boolean", id="id-bool"),
        pytest.param({"id": "", "entity": "e"}, "invalid_id", "1 to 256", id="id-empty"),
        pytest.param(
            {"id": "x" * (MAX_ID_LENGTH + 1), "entity": "e"},
            "invalid_id",
            "1 to 256",
            id="id-too-long",
        ),
        pytest.param({"id": "r", "entity": 5.5}, "wrong_type", "'entity'", id="entity-float"),
        pytest.param({"id": "r", "entity": True}, "wrong_type", "'entity'", id="entity-bool"),
        pytest.param({"id": "r", "entity": ""}, "invalid_entity", "'entity'", id="entity-empty"),
        pytest.param({"id": "r", "entity": {}}, "wrong_type", "object", id="entity-object"),
        pytest.param({"id": "r", "entity": "e", "features": [1]}, "wrong_type", "array"),
        pytest.param({"id": "r", "entity": "e", "features": "a=1"}, "wrong_type", "string"),
        pytest.param(
            {"id": "r", "entity": "e", "features": {"zzz": 1.0}},
            "unknown_feature",
            "'zzz'",
            id="unknown-feature",
        ),
        pytest.param(
            {"id": "r", "entity": "e", "features": {"a": "1.0"}},
            "wrong_type",
            "string",
            id="feature-string",
        ),
        pytest.param(
            {"id": "r", "entity": "e", "features": {"a": True}},
            "wrong_type",
            "boolean",
            id="feature-bool",
        ),
        pytest.param(
            {"id": "r", "entity": "e", "features": {"a": None}},
            "wrong_type",
            "null",
            id="feature-null",
        ),
        pytest.param(
            {"id": "r", "entity": "e", "features": {"a": [1.0]}},
            "wrong_type",
            "array",
            id="feature-array",
        ),
        pytest.param({"id": "r"}, "missing_field", "'entity' or 'features'", id="no-entity"),
        pytest.param(
            {"id": "r", "features": {"a": 1.0, "b": 2.0}},
            "missing_field",
            "['c']",
            id="no-entity-incomplete-features",
        ),
        pytest.param(
            {"id": "r", "features": {}},
            "missing_field",
            "['a', 'b', 'c']",
            id="no-entity-empty-features",
        ),
    ],
)
def test_schema_rejections(decode: Decode, doc: dict[str, Any], code: str, mentions: str) -> None:
    rej = only_rejection(decode([js(doc)]))
    assert (rej.index, rej.stage, rej.code) == (0, "schema", code)
    assert mentions in rej.reason


# --- entity ids: what may go into a Redis key -------------------------------------

GOOD_ENTITIES = [
    "e",  # one character: the shortest
    "7",
    "1234567890",
    "it-1",
    "c12",
    "123e4567-e89b-12d3-a456-426614174000",  # a UUID
    "ada.lovelace+ml@example.co.uk",  # an e-mail address
    "under_score",
    "x" * MAX_ENTITY_LENGTH,  # the longest
]

BAD_ENTITIES = [
    pytest.param("", id="empty"),
    pytest.param("x" * (MAX_ENTITY_LENGTH + 1), id="one-too-long"),
    pytest.param("tenant:42", id="namespace-separator"),
    pytest.param("{tag}", id="hash-tag-open-close"),
    pytest.param("a{b", id="brace-open"),
    pytest.param("a}b", id="brace-close"),
    pytest.param("a*", id="glob-star"),
    pytest.param("a?", id="glob-question"),
    pytest.param("a[b]", id="glob-bracket"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("a b", id="space"),
    pytest.param("a\tb", id="tab"),
    pytest.param("e1\n", id="trailing-newline"),
    pytest.param("e\x00", id="nul"),
    pytest.param("e\x7f", id="del"),
    pytest.param("caf\u00e9", id="non-ascii"),
    pytest.param("\uff45", id="fullwidth-e"),
    pytest.param("a/b", id="slash"),
    pytest.param("a%b", id="percent"),
]


@pytest.mark.parametrize("entity", GOOD_ENTITIES)
def test_valid_entity_ids(decode: Decode, entity: str) -> None:
    out = decode([js({"id": "r", "entity": entity})])
    assert out.rejections == []
    assert out.entities == {"entity": [entity]}


@pytest.mark.parametrize("entity", BAD_ENTITIES)
def test_invalid_entity_ids(decode: Decode, entity: str) -> None:
    rej = only_rejection(decode([js({"id": "r", "entity": entity})]))
    assert (rej.stage, rej.code) == ("schema", "invalid_entity")
    assert f"1 to {MAX_ENTITY_LENGTH}" in rej.reason
    assert all(32 <= ord(c) < 127 for c in rej.reason)  # printable, whatever the entity
    assert len(rej.reason) < 200  # a long entity is cut, not copied


def test_invalid_entity_beside_good_ones_refuses_only_its_record(decode: Decode) -> None:
    out = decode([js({"id": "r0", "entity": "a:b"}), js({"id": "r1", "entity": "e1"})])
    assert out.rows == [1]
    assert out.entities == {"entity": ["e1"]}
    assert [(r.index, r.code) for r in out.rejections] == [(0, "invalid_entity")]


def _request_schema_entity() -> dict[str, Any]:
    schema = json.loads(
        (Path(__file__).resolve().parents[3] / "schemas/request.schema.json").read_text()
    )
    entity: dict[str, Any] = schema["properties"]["entity"]
    return entity


@pytest.mark.parametrize("entity", [*GOOD_ENTITIES, *BAD_ENTITIES])
def test_request_schema_states_the_same_entity_rule(entity: str) -> None:
    # The schema is what producers validate against: it must accept and refuse the same
    # ids as the worker (pattern, plus a length the pattern itself does not bound).
    rule = _request_schema_entity()
    # JSON Schema patterns are ECMA-262, whose "$" (unlike Python's) never matches before
    # a final newline: Python's "\Z" is the same anchor.
    ecma = rule["pattern"].replace("$", r"\Z")
    by_schema = (
        re.search(ecma, entity) is not None
        and rule["minLength"] <= len(entity) <= rule["maxLength"]
    )
    assert by_schema == (re.fullmatch(ENTITY_PATTERN, entity) is not None)


def test_unknown_feature_name_is_escaped_in_reason(decode: Decode) -> None:
    rej = only_rejection(decode([js({"id": "r", "entity": "e", "features": {"\x1b[31m": 1}})]))
    assert rej.code == "unknown_feature"
    assert "\x1b" not in rej.reason
    assert "\\x1b" in rej.reason


def test_huge_integer_feature_is_finite_number(decode: Decode) -> None:
    # orjson reads integers beyond 64 bits as doubles: still a finite number.
    out = decode([b'{"id": "r", "features": {"a": 18446744073709551616, "b": 1, "c": 2}}'])
    assert out.rows == [0]
    assert out.inline[0] is not None
    assert out.inline[0]["a"] == pytest.approx(1.8446744073709552e19)


# --- batches mixing good and bad records -------------------------------------------


def test_columns_align_with_rows_when_good_and_bad_mix(decode: Decode) -> None:
    values: list[bytes | None] = [
        b"not json",
        js({"id": "r1", "entity": "e1"}),
        None,
        js({"id": "r3", "features": {"a": 1, "b": 2, "c": 3}}),
        js([1]),
        js({"id": 4, "entity": "e4"}),
        js({"id": "r6", "entity": "e6", "features": {"c": 9.5}}),
        b"x" * (LIMIT + 1),
    ]
    out = decode(values)
    assert out.rows == [1, 3, 6]
    assert out.ids == ["r1", "r3", "r6"]
    assert out.entities == {"entity": ["e1", None, "e6"]}
    assert out.inline == [None, {"a": 1, "b": 2, "c": 3}, {"c": 9.5}]
    got = [(r.index, r.code) for r in out.rejections]
    assert got == [
        (0, "invalid_json"),
        (2, "empty_value"),
        (4, "not_an_object"),
        (5, "wrong_type"),
        (7, "oversized"),
    ]
    # every record is accounted for exactly once
    assert sorted(out.rows + [r.index for r in out.rejections]) == list(range(len(values)))


def test_fields_may_be_a_set(decode: Decode) -> None:
    out = decode([js({"id": "r", "features": {"a": 1, "b": 2, "c": 3}})], fields={"a", "b", "c"})
    assert out.rows == [0]


# --- safe_text -----------------------------------------------------------------------


def test_safe_text_keeps_printable_ascii() -> None:
    assert safe_text("model run failed: shape (3, 30)") == "model run failed: shape (3, 30)"


def test_safe_text_escapes_control_and_non_ascii() -> None:
    out = safe_text("a\nb\tc\x00d\x7fé€\U0001f600")
    assert out == "a\\x0ab\\x09c\\x00d\\x7f\\xe9\\u20ac\\U0001f600"
    assert all(32 <= ord(ch) < 127 for ch in out)


def test_safe_text_truncates_to_limit() -> None:
    out = safe_text("x" * 1000)
    assert len(out) == MAX_REASON_LENGTH
    assert out.endswith("...")
    assert safe_text("abcdefghij", 8) == "abcde..."
    assert safe_text("abcdefgh", 8) == "abcdefgh"


def test_safe_text_truncates_after_escaping() -> None:
    out = safe_text("\n" * 100, 20)
    assert len(out) == 20
    assert out.startswith("\\x0a\\x0a")


# --- encode_dead_letter --------------------------------------------------------------


DeadLetter = Callable[..., dict[str, Any]]


@pytest.fixture
def dead_letter() -> DeadLetter:
    def make(value: bytes | None, max_value_bytes: int = 16, **kw: Any) -> dict[str, Any]:
        args: dict[str, Any] = {
            "pipeline": "p",
            "stage": "schema",
            "code": "wrong_type",
            "reason": "bad\nthing",
            "topic": "requests",
            "partition": 3,
            "offset": 42,
            "timestamp_ms": 1700000000000,
            "key": b"k\x00",
            "value": value,
            "max_value_bytes": max_value_bytes,
            "request_id": "r1",
            "worker_version": "0.1.0",
            "model": "m:1",
        }
        args.update(kw)
        doc: dict[str, Any] = orjson.loads(encode_dead_letter(**args)[0])
        return doc

    return make


def test_dead_letter_keeps_small_value(dead_letter: DeadLetter) -> None:
    doc = dead_letter(b"0123456789abcdef", max_value_bytes=16)
    assert base64.b64decode(doc["value_b64"]) == b"0123456789abcdef"
    assert doc["value_bytes"] == 16
    assert doc["key_b64"] == base64.b64encode(b"k\x00").decode()
    assert doc["source"] == {
        "topic": "requests",
        "partition": 3,
        "offset": 42,
        "timestamp_ms": 1700000000000,
    }
    assert doc["reason"] == "bad\\x0athing"
    assert (doc["pipeline"], doc["stage"], doc["code"]) == ("p", "schema", "wrong_type")
    assert (doc["request_id"], doc["worker_version"], doc["model"]) == ("r1", "0.1.0", "m:1")


def test_dead_letter_drops_value_over_limit(dead_letter: DeadLetter) -> None:
    doc = dead_letter(b"0123456789abcdefX", max_value_bytes=16)
    assert doc["value_b64"] is None
    assert doc["value_bytes"] == 17


def test_dead_letter_of_missing_value_and_key(dead_letter: DeadLetter) -> None:
    doc = dead_letter(None, key=None, request_id=None, model=None, timestamp_ms=None)
    assert doc["value_b64"] is None
    assert doc["value_bytes"] == 0
    assert doc["key_b64"] is None
    assert doc["request_id"] is None
    assert doc["source"]["timestamp_ms"] is None


def test_dead_letter_reason_is_truncated(dead_letter: DeadLetter) -> None:
    doc = dead_letter(b"v", reason="é" * 1000)
    assert len(doc["reason"]) == MAX_REASON_LENGTH
    assert doc["reason"].isascii()


# --- dead letters fit what the broker takes ------------------------------------------

ROOM = DEAD_LETTER_MAX_BYTES - 1_000  # a dead letter's headers take the rest


def _dead_letter_of(
    value: bytes | None, key: bytes | None, max_bytes: int = ROOM, max_value_bytes: int = 1 << 20
) -> tuple[bytes, bytes | None]:
    return encode_dead_letter(
        pipeline="p",
        stage="decode",
        code="invalid_json",
        reason="é" * 600,  # the longest reason there is
        topic="t" * 249,  # the longest topic name Kafka allows
        partition=2**31 - 1,
        offset=2**63 - 1,
        timestamp_ms=2**63 - 1,
        key=key,
        value=value,
        max_value_bytes=max_value_bytes,
        request_id="i" * MAX_ID_LENGTH,
        worker_version="0.1.0",
        model="m" * 200,
        max_bytes=max_bytes,
    )


def _check_fits(value: bytes | None, key: bytes | None, max_bytes: int, max_value: int) -> None:
    body, kafka_key = _dead_letter_of(value, key, max_bytes, max_value)
    assert len(body) + len(kafka_key or b"") <= max_bytes
    doc = orjson.loads(body)
    for name, original in (("key", key), ("value", value)):
        embedded = doc[f"{name}_b64"]
        kept = base64.b64decode(embedded) if embedded is not None else None
        if original is None:
            assert kept is None and not doc[f"{name}_truncated"]
            continue
        assert doc[f"{name}_bytes"] == len(original)
        if doc[f"{name}_truncated"]:
            assert kept is None or (len(kept) < len(original) and original.startswith(kept))
        else:
            assert kept == original
    assert kafka_key in (None, key)


@settings(max_examples=200, deadline=None)
@given(
    value_size=st.integers(min_value=0, max_value=1 << 20),
    key_size=st.one_of(st.none(), st.integers(min_value=0, max_value=DEFAULT_MESSAGE_MAX_BYTES)),
    room=st.integers(min_value=2_000, max_value=ROOM),
    fill=st.binary(min_size=1, max_size=8),
)
def test_any_dead_letter_fits_its_room(
    value_size: int, key_size: int | None, room: int, fill: bytes
) -> None:
    """Any value up to max_record_bytes (1 MiB) and any key up to the producer's limit."""
    value = (fill * (value_size // len(fill) + 1))[:value_size]
    key = None if key_size is None else (fill[::-1] * (key_size // len(fill) + 1))[:key_size]
    _check_fits(value, key, room, 1 << 20)


@pytest.mark.parametrize("delta", [-3, -2, -1, 0, 1, 2, 3])
def test_a_value_just_under_or_over_the_room_left_is_kept_whole_or_cut(delta: int) -> None:
    data = bytes(range(256)) * 4096
    probe = 700_000
    whole, _ = _dead_letter_of(data[:probe], None, max_bytes=10**9)
    base = len(whole) - len(base64.b64encode(data[:probe]))  # all but the embedded value
    largest = (ROOM - base) // 4 * 3  # the most raw bytes whose base64 fits the room
    value = data[: largest + delta]
    _check_fits(value, None, ROOM, 1 << 20)
    doc = orjson.loads(_dead_letter_of(value, None)[0])
    assert doc["value_truncated"] is (delta > 0)
    assert len(base64.b64decode(doc["value_b64"])) == min(len(value), largest)


def test_a_small_key_stays_the_dead_letters_kafka_key() -> None:
    _, key = _dead_letter_of(b"v", b"k" * 1000)
    assert key == b"k" * 1000


def test_a_key_over_a_quarter_of_the_room_is_not_the_kafka_key_but_is_embedded() -> None:
    body, key = _dead_letter_of(b"v", b"k" * 500_000)
    assert key is None
    doc = orjson.loads(body)
    assert base64.b64decode(doc["key_b64"]) == b"k" * 500_000 and not doc["key_truncated"]


def test_a_room_too_small_for_anything_still_gives_the_bare_dead_letter() -> None:
    body, key = _dead_letter_of(b"value", b"key", max_bytes=10)
    doc = orjson.loads(body)
    assert key is None
    assert doc["value_b64"] is None and doc["value_truncated"]
    assert doc["key_b64"] is None and doc["key_truncated"]


# --- other request shapes ----------------------------------------------------------


NESTED = RequestShape(
    id_path=("meta", "request_id"),
    features_path=("x",),
    features_array=("amount", "country"),
    lookups=(("user", ("user", "id"), ("age",)), ("merchant", ("merchant_id",), ())),
    kinds={"amount": "number", "country": "text", "age": "number"},
)


def test_nested_id_entity_paths_and_an_array_of_features() -> None:
    doc = {"meta": {"request_id": "r1"}, "user": {"id": "u1"}, "merchant_id": 7, "x": [2.5, "FR"]}
    out = decode_requests([js(doc)], NESTED, LIMIT)
    assert out.ids == ["r1"]
    assert out.entities == {"user": ["u1"], "merchant": ["7"]}
    assert out.inline == [{"amount": 2.5, "country": "FR"}]
    assert out.docs == [doc]


@pytest.mark.parametrize(
    ("doc", "code", "mentions", "request_id"),
    [
        (
            {"id": "r1", "user": {"id": "u"}, "x": [1, "FR"]},
            "missing_field",
            "'meta.request_id'",
            None,
        ),
        ({"meta": "r1", "x": [1, "FR"]}, "missing_field", "'meta.request_id'", None),
        (
            {"meta": {"request_id": "r2"}, "user": {"id": "u"}, "x": [1]},
            "wrong_type",
            "2 values",
            "r2",
        ),
        (
            {"meta": {"request_id": "r3"}, "user": {"id": "u"}, "x": [1, 2]},
            "wrong_type",
            "'country' must be a string",
            "r3",
        ),
        (
            {"meta": {"request_id": "r4"}, "user": {"id": "u"}, "x": ["1", "FR"]},
            "wrong_type",
            "'amount' must be a number",
            "r4",
        ),
        (
            {"meta": {"request_id": "r5"}, "user": {"id": 1.5}, "x": [1, "FR"]},
            "wrong_type",
            "'user.id'",
            "r5",
        ),
        (
            {"meta": {"request_id": "r6"}, "x": [1, "FR"]},
            "missing_field",
            "no 'user.id' and features lack ['age']",
            "r6",
        ),
    ],
)
def test_nested_shape_rejections_name_the_path_and_keep_the_id(
    doc: dict[str, Any], code: str, mentions: str, request_id: str | None
) -> None:
    out = decode_requests([js(doc)], NESTED, LIMIT)
    (rej,) = out.rejections
    assert (rej.code, rej.request_id) == (code, request_id)
    assert mentions in rej.reason


# --- the quick path agrees with the full check ------------------------------------

_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.floats(allow_nan=False), max_size=2),
)


@settings(max_examples=500, deadline=None)
@given(
    rid=st.sampled_from(["r1", "r1", "r1", "", "x" * (MAX_ID_LENGTH + 1), 7, None]),
    entity=st.sampled_from(["e1", "e1", "a.b@c", "", "x:y", 5, None]),
    feats=st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(["a", "b", "c", "a", "b", "zz"]), _VALUES, max_size=3),
        st.lists(st.floats(), max_size=2),
    ),
)
def test_decoding_a_request_gives_what_the_full_check_gives(
    rid: Any, entity: Any, feats: Any
) -> None:
    """Requests with an entity and inline values of every JSON type (and, through a
    loads hook, NaN and infinity): each is accepted or refused as the full check would."""
    doc: dict[str, Any] = {"id": rid, "entity": entity}
    if feats is not None:
        doc["features"] = feats
    shape = RequestShape.simple(FIELDS)
    out = decode_requests([b"x"], shape, LIMIT, loads=lambda _v: doc)
    checked = _Checker(shape)(doc)
    if isinstance(checked, _Problem):
        assert [(r.code, r.reason) for r in out.rejections] == [checked]
    else:
        want_rid, want_entities, want_feats = checked
        assert (out.rows, out.ids, out.entities["entity"]) == ([0], [want_rid], want_entities)
        assert out.inline == [want_feats]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_inline_value_from_a_registry_format_is_refused(
    decode: Decode, value: float
) -> None:
    doc = {"id": "r", "entity": "e", "features": {"a": value}}
    shape = RequestShape.simple(FIELDS)
    out = decode_requests([b"x"], shape, LIMIT, loads=lambda _v: doc)
    rej = only_rejection(out)
    assert (rej.code, rej.reason) == ("non_finite", "feature 'a' is not finite")


# --- results encoded together, cut apart ------------------------------------------


@pytest.mark.parametrize(
    "docs",
    [
        pytest.param([], id="none"),
        pytest.param([{"id": "r1", "v": 1}], id="one"),
        pytest.param([{"id": "r1", "v": [0.5, 1e-300]}, {"id": "r2", "v": None}], id="two"),
        pytest.param(
            [{"id": 'a"},{"id":"b', "k": "\\"}, {"id": "},{", "k": '\\"'}],
            id="the-cut-inside-strings",
        ),
        pytest.param(
            [{"id": "r1", "out": [{"id": 1}, {"id": 2}]}, {"id": "r2", "out": []}],
            id="nested-objects-with-the-first-key",
        ),
        pytest.param([{"id": "é\u2028\x00", "k": None}] * 3, id="unicode-and-control"),
    ],
)
def test_open_objects_are_each_doc_without_its_closing_brace(docs: list[dict[str, Any]]) -> None:
    pieces = open_objects(docs, "id")
    assert len(pieces) == len(docs)
    for piece, doc in zip(pieces, docs, strict=True):
        assert piece == orjson.dumps(doc)[:-1]
        assert orjson.loads(piece + b"}") == doc


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"id": st.text(max_size=8), "key": st.one_of(st.none(), st.text(max_size=8))},
            optional={
                "outputs": st.dictionaries(
                    st.text(max_size=3), st.integers(-(2**63), 2**63 - 1), max_size=2
                )
            },
        ),
        max_size=6,
    )
)
def test_open_objects_of_any_strings(docs: list[dict[str, Any]]) -> None:
    assert open_objects(docs, "id") == [orjson.dumps(doc)[:-1] for doc in docs]
