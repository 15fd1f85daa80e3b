"""Results written as Avro records framed for the Schema Registry (``result_format =
"avro"``): the same fields a JSON result carries.

The result schema is the pipeline's ``result_schema`` file, or derived from one row of
the model's outputs (``derived_schema``). At start-up the schema is parsed as the Avro
specification reads it (``avro_schema``: an invalid logical type is ignored), one example
result is written with it, and the schema is registered under its subject
(``auto_register``) or found there, as confluent-kafka's ``AvroSerializer`` would; its id
gives the frame (byte 0 and the schema id) every result then starts with. Each result is
written by fastavro's ``schemaless_writer`` after that frame: no subject or rule step
runs per record. A schema that cannot be parsed, a result it does not take, or a
registry that refuses it stops the worker with a ``ConfigError``; a registry that cannot
answer, with a ``SchemaRegistryError``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from io import BytesIO
from typing import Any

import orjson

from worker.config import PipelineConfig
from worker.errors import ConfigError, SchemaRegistryError
from worker.registry.avro_schema import parse_avro
from worker.registry.client import NOT_FOUND, not_found, outage, status_of

__all__ = ["AvroResults", "derived_schema"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODEL_FIELDS = ("name", "version", "sha256")


def derived_schema(pipeline: str, sample: Mapping[str, Any]) -> dict[str, Any]:
    """The result record for outputs like ``sample`` (one row of them): numbers, bools,
    strings and (nested) arrays of them, as ``row_outputs`` gives."""
    outputs = []
    for name, value in sample.items():
        if not _NAME.fullmatch(name):
            raise ConfigError(
                f"pipelines.{pipeline}: output {name!r} is not an Avro field name (letters, "
                "digits and _, not first a digit): rename it with model.outputs, or give "
                "result_schema"
            )
        outputs.append({"name": name, "type": _avro_type(value)})
    safe = re.sub(r"\W", "_", pipeline)
    namespace = "streamfer." + (safe if _NAME.fullmatch(safe) else f"_{safe}")
    return {
        "type": "record",
        "name": "Result",
        "namespace": namespace,
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "key", "type": ["null", "string"], "default": None},
            {"name": "outputs", "type": {"type": "record", "name": "Outputs", "fields": outputs}},
            {"name": "request_ts_ms", "type": ["null", "long"], "default": None},
            {
                "name": "model",
                "type": {
                    "type": "record",
                    "name": "Model",
                    "fields": [{"name": n, "type": "string"} for n in _MODEL_FIELDS],
                },
            },
            {"name": "pipeline", "type": "string"},
            {"name": "timings_ms", "type": {"type": "map", "values": "double"}},
        ],
    }


def _avro_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return {"type": "array", "items": _avro_type(value[0]) if value else "double"}
    raise ConfigError(f"an output of type {type(value).__name__} has no Avro type here")


class AvroResults:
    """Encodes one pipeline's results: ``encode(doc)`` gives the framed record."""

    def __init__(self, p: PipelineConfig, client: Any, sample: Mapping[str, Any]) -> None:
        from confluent_kafka.schema_registry import (
            Schema,
            record_subject_name_strategy,
            topic_record_subject_name_strategy,
            topic_subject_name_strategy,
        )
        from confluent_kafka.serialization import MessageField, SerializationContext
        from fastavro import schemaless_writer

        where = f"pipelines.{p.name}"
        if p.result_schema is not None:
            try:  # sent as written: a registry may match a schema by its text
                text = p.result_schema.read_text()
                schema = orjson.loads(text)
            except (OSError, orjson.JSONDecodeError) as exc:
                raise ConfigError(f"{where}.result_schema: {exc}") from None
        else:
            schema = derived_schema(p.name, sample)
            text = orjson.dumps(schema).decode()
        strategy = {
            "topic": topic_subject_name_strategy,
            "record": record_subject_name_strategy,
            "topic_record": topic_record_subject_name_strategy,
        }[p.result_subject_strategy]
        ctx = SerializationContext(p.result_topic, MessageField.VALUE)
        name, namespace = str(schema.get("name", "")), schema.get("namespace")
        full_name = f"{namespace}.{name}" if namespace and "." not in name else name
        self.subject: str = strategy(ctx, full_name) or f"{p.result_topic}-value"
        try:
            self._parsed = parse_avro(schema)
        except Exception as exc:  # fastavro's refusal, whichever of its errors
            raise ConfigError(
                f"{where}: the result schema cannot be used ({type(exc).__name__}: {exc})"
            ) from None
        self._write: Callable[..., Any] = schemaless_writer
        self._frame = b""  # until the schema id is known
        example = {
            "id": "streamfer-example",
            "key": None,
            "outputs": dict(sample),
            "request_ts_ms": 0,
            "model": dict.fromkeys(_MODEL_FIELDS, ""),
            "pipeline": p.name,
            "timings_ms": {},
        }
        try:
            self.encode(example)
        except Exception as exc:  # fastavro's, whichever of its errors
            raise ConfigError(
                f"{where}: a result does not fit the result schema ({type(exc).__name__}: {exc})"
            ) from None
        registered = Schema(text.strip(), "AVRO")
        try:
            if p.auto_register:
                self.schema_id = int(client.register_schema(self.subject, registered))
            else:
                self.schema_id = int(client.lookup_schema(self.subject, registered).schema_id)
        except Exception as exc:  # the client's errors, or httpx's
            raise self._refusal(exc, where, p.auto_register) from None
        self._frame = b"\x00" + self.schema_id.to_bytes(4, "big")

    def _refusal(self, exc: Exception, where: str, auto_register: bool) -> Exception:
        status = status_of(exc)
        if not_found(exc) and not auto_register:
            return ConfigError(
                f"{where}: the result schema is not registered under subject {self.subject}: "
                "register it, or set auto_register = true"
            )
        if status == NOT_FOUND:  # not the registry's answer: no registry at this URL
            return ConfigError(f"{where}: {outage(exc, f'registering {self.subject}')}")
        if status is not None and 400 <= status < 500:
            return ConfigError(f"{where}: the registry refuses the result schema: {exc}")
        error: SchemaRegistryError = outage(exc, f"registering {self.subject}")
        return error

    def encode(self, doc: Mapping[str, Any]) -> bytes:
        """The framed record for ``doc``; raises when it does not fit the schema."""
        buf = BytesIO()
        buf.write(self._frame)
        self._write(buf, self._parsed, doc)
        return buf.getvalue()
