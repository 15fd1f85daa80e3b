"""Requests framed for a Schema Registry: Avro, Protobuf or JSON Schema records in the
Confluent wire format (magic byte 0, a 4-byte big-endian schema id, the payload).

Each batch first resolves the schema ids it carries, once per new id (the client caches
them by id for the life of the process): an id the registry says it does not know, one
whose schema is of another type, or one whose schema cannot be parsed makes its records
dead letters (``unknown_schema``, ``wrong_schema_type``, ``invalid_schema``), while a
registry that cannot answer is an outage the whole batch waits out
(``SchemaRegistryError``). Then each value is decoded with the writer's schema (Avro by
fastavro, the schema read as the Avro specification reads it; Protobuf and JSON Schema by
confluent-kafka's deserializers) and becomes the same plain document a JSON request
parses to, so the request mapping, lookups and inline features read it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from io import BytesIO
from typing import TYPE_CHECKING, Any, Literal

import orjson

from worker.config import PipelineConfig, WorkerConfig, import_target
from worker.core import Clock, monotonic_clock
from worker.errors import ConfigError
from worker.registry.avro_schema import parse_avro
from worker.registry.client import is_transport, not_found, outage, status_of
from worker.registry.undecodable import RecordUndecodable

if TYPE_CHECKING:
    from google.protobuf.message import Message as ProtoMessage

__all__ = [
    "FRAMED_FORMATS",
    "FramedRequests",
    "decoder_for",
    "framed_decoders",
    "load_message_type",
]

FramedFormat = Literal["avro", "protobuf", "json-schema"]
FRAMED_FORMATS: dict[str, str] = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}
"""Each framed request format, and the registry's name for its schema type."""
_INVALID = {"avro": "invalid_avro", "protobuf": "invalid_protobuf", "json-schema": "invalid_json"}
_UNKNOWN_RECHECK_S = 30.0
"""An id the registry did not know is asked for again after this long (it may be
registered since); until then its records are dead letters without a round trip."""
_MISSING = ("", "")
"""What ``_known`` gives for an id it lacks (by identity)."""


def _no_subject(ctx: object, record_name: object) -> None:
    return None


_WRITERS_SCHEMA: dict[str, Any] = {"subject.name.strategy": _no_subject}
"""No subject, so no reader schema: every record is read with the schema it was written
with (its id), and no subject's latest version is fetched per topic."""


def framed_decoders(config: WorkerConfig, client: Any | None) -> dict[str, FramedRequests]:
    """The decoder of every pipeline whose requests are framed, by pipeline name, all
    sharing ``client`` (``open_registry``'s)."""
    return {p.name: d for p in config.pipelines if (d := decoder_for(p, client)) is not None}


def decoder_for(p: PipelineConfig, client: Any | None) -> FramedRequests | None:
    """The decoder of pipeline ``p``'s framed requests; None for JSON requests."""
    fmt = p.request_format
    if fmt == "json":
        return None
    message_type = None
    if fmt == "protobuf" and p.request_protobuf is not None:
        message_type = load_message_type(p.request_protobuf, f"pipelines.{p.name}.request_protobuf")
    return FramedRequests(fmt, client, message_type=message_type)


def load_message_type(target: str, field: str) -> type[ProtoMessage]:
    """The generated Protobuf message class ``package.module:Message``."""
    from google.protobuf.message import Message as ProtoMessage

    found = import_target(target, field)
    if not (isinstance(found, type) and issubclass(found, ProtoMessage)):
        raise ConfigError(f"{field}: {target!r} is not a generated Protobuf message class")
    return found


class FramedRequests:
    """Decodes one pipeline's framed requests; ``for_batch`` once per batch, then the
    function it returns once per value (it raises ``RecordUndecodable``)."""

    def __init__(
        self,
        fmt: FramedFormat,
        client: Any | None,
        *,
        message_type: type[ProtoMessage] | None = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        """``clock`` times when an id the registry did not know is asked for again."""
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        from worker.registry.proto_docs import message_doc

        self._format = fmt
        self._client = client
        self._clock = clock
        self._schema_type = FRAMED_FORMATS[fmt]
        self._invalid = _INVALID[fmt]
        self._known: dict[int, tuple[str, str] | None] = {}
        """Schema ids resolved: None when usable, else the code and reason of their
        records' dead letters (another schema type, a schema that cannot be parsed)."""
        self._unknown: dict[int, float] = {}
        """Schema ids the registry did not know, and when to ask again."""
        self._avro: dict[int, Any] = {}
        """Avro writer schemas (with the named types of their references) parsed by
        fastavro once per id: records are read by ``fastavro.schemaless_reader``
        directly, a third of confluent-kafka's deserializer's cost per record (which runs
        its subject, rule and schema-cache steps for every record)."""
        self._read_avro: Callable[..., Any] | None = None
        self._decode: Callable[[bytes, None], Any]
        self._to_doc: Callable[[Any], Any] = _same
        if fmt == "protobuf":
            if message_type is None:
                raise ConfigError('request_format = "protobuf" needs request_protobuf')
            # no registry client: the message class is the reader's schema, and the
            # payload's message indexes are read from the frame (schema ids are
            # checked against the registry in ``for_batch`` all the same)
            self._decode = ProtobufDeserializer(
                message_type, {"use.deprecated.format": False, **_WRITERS_SCHEMA}
            )
            self._to_doc = message_doc
        elif client is None:
            raise ConfigError(f'request_format = "{fmt}" needs [schema_registry] url')
        elif fmt == "avro":
            from fastavro import schemaless_reader

            self._read_avro = schemaless_reader
        else:
            self._decode = JSONDeserializer(
                None, schema_registry_client=client, conf=_WRITERS_SCHEMA, json_decode=orjson.loads
            )

    def for_batch(self, values: Sequence[bytes | None]) -> Callable[[bytes], Any]:
        """Resolve the batch's new schema ids; raises SchemaRegistryError while the
        registry cannot answer, before any record is judged."""
        if self._client is not None:
            known, unknown = self._known, self._unknown
            now = self._clock()
            for raw in {v[1:5] for v in values if v and len(v) > 5 and v[0] == 0}:
                schema_id = int.from_bytes(raw, "big")
                if schema_id not in known and unknown.get(schema_id, 0.0) <= now:
                    self._resolve(schema_id, now)
        return self._loads

    def _resolve(self, schema_id: int, now: float) -> None:
        client: Any = self._client
        try:
            schema = client.get_schema(schema_id)
        except Exception as exc:  # the client raises httpx's errors as well as its own
            if not_found(exc):
                self._unknown[schema_id] = now + _UNKNOWN_RECHECK_S
                return
            raise outage(exc, f"fetching schema id {schema_id}") from exc
        self._unknown.pop(schema_id, None)
        kind = schema.schema_type or "AVRO"
        if kind != self._schema_type:
            self._known[schema_id] = (
                "wrong_schema_type",
                f"schema id {schema_id} is a {kind} schema; this pipeline reads "
                f"{self._format} ({self._schema_type}) requests",
            )
            return
        if kind == "AVRO":
            try:
                self._avro[schema_id] = parse_avro(schema.schema_str or "", self._named(schema))
            except Exception as exc:  # the registry's, or the parser's for this schema
                if _registrys_fault(exc):
                    raise outage(exc, f"fetching the references of schema id {schema_id}") from exc
                self._known[schema_id] = (
                    "invalid_schema",
                    f"schema id {schema_id} cannot be used: {type(exc).__name__}: {exc}",
                )
                return
        self._known[schema_id] = None

    def _named(self, schema: Any) -> dict[str, Any]:
        """The named types ``schema``'s references define, theirs included, each by the
        reference's name and by its full name (as confluent-kafka's deserializer has
        them)."""
        client: Any = self._client
        named: dict[str, Any] = {}
        for ref in schema.references or ():
            found = client.get_version(ref.subject, ref.version, True)
            named.update(self._named(found.schema))
            raw = orjson.loads(found.schema.schema_str or "")
            named[ref.name] = raw
            if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                space, name = raw.get("namespace"), raw["name"]
                named[f"{space}.{name}" if space and "." not in name else name] = raw
        return named

    def _loads(self, value: bytes) -> Any:
        if len(value) <= 5 or value[0] != 0:
            raise RecordUndecodable(
                "not_schema_framed",
                f"record value is not in the Schema Registry wire format (byte 0, a 4-byte "
                f"schema id, the {self._format} payload): it starts with {value[:6]!r}",
            )
        schema_id = int.from_bytes(value[1:5], "big")
        if self._client is not None:
            problem = self._known.get(schema_id, _MISSING)
            if problem is _MISSING:
                raise RecordUndecodable(
                    "unknown_schema", f"schema id {schema_id} is not in the schema registry"
                )
            if problem is not None:
                raise RecordUndecodable(*problem)
        try:
            if self._read_avro is not None:
                stream = BytesIO(value)
                stream.seek(5)  # past the frame: byte 0 and the schema id
                decoded = self._read_avro(stream, self._avro[schema_id], None)
            else:
                decoded = self._decode(value, None)
        except Exception as exc:  # a corrupt payload fails anywhere in the decoder
            if _registrys_fault(exc):
                raise outage(exc, "reading a schema a record refers to") from exc
            raise RecordUndecodable(
                self._invalid,
                f"not a valid {self._format} record for its schema id {schema_id} "
                f"({type(exc).__name__}: {exc})",
            ) from None
        return self._to_doc(decoded)


def _registrys_fault(exc: BaseException) -> bool:
    """A failure of the registry (unreachable, any HTTP error but its own "not found"),
    not of what it holds."""
    status = status_of(exc)
    return (status is not None and not not_found(exc)) or is_transport(exc)


def _same(doc: Any) -> Any:
    return doc
