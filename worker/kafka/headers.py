"""The headers streamfer puts on results and dead letters.

A result or dead letter carries where its request came from (``streamfer.source_topic``,
``_partition``, ``_offset``) and its request id, unless a pipeline turns source headers
off; either way a request's W3C ``traceparent`` carries through. ``SourceHeaders`` builds
them once per batch, encoding each topic and partition once rather than per record.
"""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from worker.core import PartitionKey, safe_text
from worker.kafka.sink import Headers

__all__ = [
    "MAX_RESULT_HEADERS_BYTES",
    "SourceHeaders",
    "reason_header",
    "trace_headers",
]

TRACEPARENT_MAX = 128
MAX_RESULT_HEADERS_BYTES = 2048
"""More than a result's headers can weigh: the request id (at most 256 characters), the
source headers and a traceparent."""


class SourceHeaders:
    """Builds the source headers of one batch's records, encoding each topic and
    partition once instead of once per record."""

    __slots__ = ("_fixed",)

    def __init__(self) -> None:
        self._fixed: dict[PartitionKey, tuple[tuple[str, bytes], tuple[str, bytes]]] = {}

    def of(self, msg: Message, request_id: str | None) -> Headers:
        where = cast(PartitionKey, (msg.topic(), msg.partition()))
        fixed = self._fixed.get(where)
        if fixed is None:
            topic, partition = where
            fixed = self._fixed[where] = (
                ("streamfer.source_topic", topic.encode()),
                ("streamfer.source_partition", b"%d" % partition),
            )
        offset = ("streamfer.source_offset", b"%d" % cast(int, msg.offset()))
        headers: Headers = (
            [fixed[0], fixed[1], offset]
            if request_id is None
            else [
                ("streamfer.request_id", request_id.encode("utf-8", "replace")),
                fixed[0],
                fixed[1],
                offset,
            ]
        )
        incoming = msg.headers()
        if incoming:
            _copy_traceparent(cast("list[tuple[str, bytes | None]]", incoming), headers)
        return headers


def trace_headers(msg: Message, _request_id: str | None) -> Headers | None:
    """Only the W3C trace context, when the request has one."""
    incoming = msg.headers()
    if not incoming:
        return None
    headers: Headers = []
    _copy_traceparent(cast("list[tuple[str, bytes | None]]", incoming), headers)
    return headers or None


def _copy_traceparent(incoming: list[tuple[str, bytes | None]], headers: Headers) -> None:
    for name, value in incoming:
        if name == "traceparent" and value and len(value) <= TRACEPARENT_MAX:
            headers.append(("traceparent", value))  # W3C trace context carries through
            return


def reason_header(reason: str) -> bytes:
    """A readable reason as a header value: printable ASCII, cut to length."""
    return safe_text(reason).encode("ascii")
