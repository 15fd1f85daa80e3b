"""A Protobuf request message built at import, with no generated code or protoc: what
``request_protobuf = "streamfer_dev.request_messages:ScoreRequest"`` names in the tests
and the examples. A user's own is their ``*_pb2`` module's class.

    message ScoreRequest {
      string id = 1;
      string entity = 2;
      map<string, double> features = 3;
      optional int64 sent_ms = 4;
    }
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

__all__ = ["AVRO_SCHEMA", "PROTO_SCHEMA", "ScoreRequest"]

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ScoreRequest",
    "namespace": "streamfer.examples",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "entity", "type": ["null", "string"], "default": None},
        {
            "name": "features",
            "type": ["null", {"type": "map", "values": "double"}],
            "default": None,
        },
    ],
}
"""The same request as an Avro record: an entity id, or features inline."""

PROTO_SCHEMA = """syntax = "proto3";
package streamfer.examples;

message ScoreRequest {
  string id = 1;
  string entity = 2;
  map<string, double> features = 3;
  optional int64 sent_ms = 4;
}
"""
"""The same message as .proto text (what a registry holds for it)."""


def _build() -> Any:
    fd = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="streamfer/examples/score_request.proto", package="streamfer.examples", syntax="proto3"
    )
    msg = file.message_type.add(name="ScoreRequest")
    entry = msg.nested_type.add(name="FeaturesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=fd.TYPE_DOUBLE, label=fd.LABEL_OPTIONAL)
    msg.field.add(name="id", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    msg.field.add(name="entity", number=2, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    msg.field.add(
        name="features",
        number=3,
        type=fd.TYPE_MESSAGE,
        label=fd.LABEL_REPEATED,
        type_name=".streamfer.examples.ScoreRequest.FeaturesEntry",
    )
    msg.oneof_decl.add(name="_sent_ms")
    msg.field.add(
        name="sent_ms",
        number=4,
        type=fd.TYPE_INT64,
        label=fd.LABEL_OPTIONAL,
        oneof_index=0,
        proto3_optional=True,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("streamfer.examples.ScoreRequest"))


ScoreRequest: Any = _build()
