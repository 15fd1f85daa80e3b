"""A decoded Protobuf message as the plain document a JSON request parses to.

Not ``json_format.MessageToDict``: the JSON mapping writes 64-bit integers as strings,
and a request's numbers must stay numbers. Here a message is a dict of its fields, a
map a dict, a repeated field a list, an enum its name. Proto3 cannot tell an empty map
or list from an absent one, nor an unset ``optional`` scalar or string from none: those are
left out (a request without inline features or an entity); numbers and bools are kept
at their default."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["message_doc"]

_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_ENUM = FieldDescriptor.TYPE_ENUM
_TEXT = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES)


def message_doc(message: Message) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value:
                doc[field.name] = {k: _scalar_or_doc(value_field, v) for k, v in value.items()}
        elif _repeated(field):
            if value:
                doc[field.name] = [_scalar_or_doc(field, v) for v in value]
        elif field.type == _MESSAGE:
            if message.HasField(field.name):
                doc[field.name] = message_doc(value)
        elif field.has_presence and not message.HasField(field.name):
            continue  # an optional scalar left unset reads as missing, not 0
        elif field.type in _TEXT and not value:
            continue  # proto3's unset string: an entity left out, not an empty one
        else:
            doc[field.name] = _scalar_or_doc(field, value)
    return doc


def _repeated(field: FieldDescriptor) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf 5.28+; label before
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _scalar_or_doc(field: FieldDescriptor, value: Any) -> Any:
    if field.type == _MESSAGE:
        return message_doc(value)
    if field.type == _ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    return value
