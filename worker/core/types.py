"""Plain records passed between stages: frozen, slotted, no behaviour.

They are made once per batch or once per refused record, never per good record, so
the hot path stays free of per-record Python objects beyond what decoding needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DecodedRequests", "PartitionKey", "Refusal", "Rejection", "Source", "StageTimings"]

PartitionKey = tuple[str, int]
"""Topic and partition: the key of every per-partition map."""

Source = tuple[str, int, int]
"""Topic, partition and offset of a consumed request."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Record ``index`` of a batch was refused at ``stage`` for ``reason``."""

    index: int
    stage: str
    code: str
    reason: str
    request_id: str | None = None
    """The request's id, when it was read before the record was refused."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """The broker refused what was produced for the request at ``source`` for itself
    (a keyless result on a compacted topic, say): the dead letter to send for it instead,
    ``bare`` without the original key and value (a dead letter itself was refused)."""

    source: Source
    stage: str
    code: str
    reason: str
    request_id: str | None
    bare: bool = False


@dataclass(frozen=True, slots=True)
class DecodedRequests:
    """The good requests of one batch, column by column, plus the refused ones.

    ``rows[i]`` is the position in the batch of the i-th good request; the other
    columns are aligned with ``rows``.
    """

    rows: list[int]
    ids: list[str]
    entities: dict[str, list[str | None]]
    """Per lookup name, each request's entity id (None: the request carries that
    lookup's features inline)."""
    inline: list[dict[str, Any] | None]
    rejections: list[Rejection] = field(default_factory=list)
    docs: list[dict[str, Any]] = field(default_factory=list)
    """The parsed requests, for batch hooks."""


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Milliseconds spent per stage for one batch; copied into every result. Each stage
    that adds its own hands on a new value (``dataclasses.replace``)."""

    wait_ms: float = 0.0
    decode_ms: float = 0.0
    enrich_ms: float = 0.0
    infer_ms: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "wait_ms": round(self.wait_ms, 3),
            "decode_ms": round(self.decode_ms, 3),
            "enrich_ms": round(self.enrich_ms, 3),
            "infer_ms": round(self.infer_ms, 3),
        }
