"""Requests framed for a Schema Registry (Avro, Protobuf, JSON Schema): the registry
client, what its failures mean, and decoding a batch's values into the documents a JSON
request parses to.

Only ``RecordUndecodable`` is imported up front; the rest is read on first use
(``worker.core.lazy``), so a worker serving JSON loads no Schema Registry library."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core import lazy_names
from worker.registry.undecodable import RecordUndecodable

if TYPE_CHECKING:
    from worker.registry.avro_results import AvroResults, derived_schema
    from worker.registry.client import (
        needs_registry,
        open_registry,
        outage,
        registry_client,
        start_refusal,
    )
    from worker.registry.framed_requests import (
        FRAMED_FORMATS,
        FramedRequests,
        decoder_for,
        framed_decoders,
        load_message_type,
    )

__all__ = [
    "FRAMED_FORMATS",
    "AvroResults",
    "FramedRequests",
    "RecordUndecodable",
    "decoder_for",
    "derived_schema",
    "framed_decoders",
    "load_message_type",
    "needs_registry",
    "open_registry",
    "outage",
    "registry_client",
    "start_refusal",
]

__getattr__ = lazy_names(
    __name__,
    {
        "AvroResults": "avro_results",
        "derived_schema": "avro_results",
        "FRAMED_FORMATS": "framed_requests",
        "FramedRequests": "framed_requests",
        "decoder_for": "framed_requests",
        "framed_decoders": "framed_requests",
        "load_message_type": "framed_requests",
        "open_registry": "client",
        "needs_registry": "client",
        "outage": "client",
        "registry_client": "client",
        "start_refusal": "client",
    },
)
