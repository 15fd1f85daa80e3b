"""Avro schemas read as the Avro specification reads them: a logical type whose
parameters are invalid (a decimal whose scale exceeds its precision, say) is ignored and
its underlying type used, as Java's Avro and the registries built on it do. fastavro
refuses such a schema instead, so the annotation is dropped before fastavro parses it.

Used for the writer schemas of framed requests and for the result schema; a schema that
still cannot be parsed raises what fastavro (or the JSON parser) raised."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["parse_avro", "spec_schema"]


def parse_avro(schema: str | Any, named: Mapping[str, Any] | None = None) -> Any:
    """fastavro's parsed form of ``schema`` (its text, or its JSON form), the named types
    it refers to given by ``named`` (name: JSON form, as the registry's references are)."""
    from fastavro import parse_schema
    from fastavro.repository.base import AbstractSchemaRepository
    from fastavro.schema import load_schema

    root = spec_schema(orjson.loads(schema) if isinstance(schema, str) else schema)
    if not named:
        return parse_schema(root)
    found = {name: spec_schema(raw) for name, raw in named.items()}
    found["$root"] = root

    class _Named(AbstractSchemaRepository):
        def load(self, subject: str) -> Any:
            return found.get(subject)

    return load_schema("$root", repo=_Named())


def spec_schema(schema: Any) -> Any:
    """A copy of ``schema`` (JSON form) without the logical types the specification
    says to ignore; every other part as given."""
    if isinstance(schema, list):
        return [spec_schema(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    node = dict(schema)
    if isinstance(node.get("type"), dict | list):
        node["type"] = spec_schema(node["type"])
    for key in ("items", "values"):
        if key in node:
            node[key] = spec_schema(node[key])
    fields = node.get("fields")
    if isinstance(fields, list):
        node["fields"] = [
            {**f, "type": spec_schema(f["type"])} if isinstance(f, dict) and "type" in f else f
            for f in fields
        ]
    if node.get("logicalType") == "decimal" and not _valid_decimal(node):
        del node["logicalType"]
    return node


def _valid_decimal(node: Mapping[str, Any]) -> bool:
    """The specification's decimal: bytes or fixed, a positive precision (that fits a
    fixed's size), a scale from 0 to the precision."""
    precision, scale, kind = node.get("precision"), node.get("scale", 0), node.get("type")
    if type(precision) is not int or type(scale) is not int:
        return False
    if precision <= 0 or not 0 <= scale <= precision:
        return False
    if kind == "fixed":
        size = node.get("size")
        return type(size) is int and precision <= math.floor(math.log10(2) * (8 * size - 1))
    return kind == "bytes"
